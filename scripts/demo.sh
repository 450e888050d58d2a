#!/usr/bin/env bash
# The main job: start a local control plane (real etcd, kube-apiserver,
# kube-controller-manager), the pkobatch controller and a node agent, then run a real
# Pulumi Stack end to end (up, refresh, destroy) and print its status and outputs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The demo's program is Python with dynamic providers: no YAML host, no Kubernetes provider.
bash scripts/bootstrap.sh etcd kubernetes pulumi
exec .venv/bin/pkobatch dev demo "$@"
