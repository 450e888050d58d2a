#!/usr/bin/env bash
# The main job: start a local control plane (real etcd, kube-apiserver,
# kube-controller-manager), the pkobatch controller and a node agent, then run a real
# Pulumi Stack end to end (up, refresh, destroy) and print its status and outputs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
exec .venv/bin/pkobatch dev demo "$@"
