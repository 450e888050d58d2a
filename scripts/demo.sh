#!/usr/bin/env bash
# The main job: start a local control plane (real etcd, kube-apiserver,
# kube-controller-manager), the pkobatch controller and a node agent, then run a real
# Pulumi Stack end to end (up, refresh, destroy) and print its status and outputs.
#
#   bash scripts/demo.sh --node real   the Stack's run in a container of pkobatch's runner
#       image on a real node (kubelet, containerd; needs root), pkobatch installed with
#       `kubectl apply -k` from its own images; the environment keeps running
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The demo's program is Python with dynamic providers: no YAML host, no Kubernetes provider.
components=(etcd kubernetes pulumi)
previous=
for arg in "$@"; do
  if [ "$arg" = --node=real ] || { [ "$previous" = --node ] && [ "$arg" = real ]; }; then
    # The real node, and the YAML host and Kubernetes provider the runner image carries;
    # buildah and mmdebstrap build the images.
    components=(--image-builder "${components[@]}" yaml kubernetes_provider node containerd cni_plugins crictl)
  fi
  previous=$arg
done
bash scripts/bootstrap.sh "${components[@]}"
exec .venv/bin/pkobatch dev demo "$@"
