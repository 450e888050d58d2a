#!/usr/bin/env bash
# Run every check and every test (unit, integration against a real control plane, end to
# end with the real Pulumi CLI). This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
# helm, promtool and the Prometheus Operator's CRDs, for the tests of deploy/, Flux's
# source-controller, for the tests of spec.fluxSource, Argo CD's health check and kstatus,
# for the GitOps health tests, an OCI registry, for the chart installed from one, the real
# node (kubelet, kube-proxy, kube-scheduler, pause, containerd, the CNI plugins, crictl),
# for tests/node, and two older Pulumi CLIs, for the
# PulumiVersionTooLow test and config on a CLI between it and today's (cached by version).
bash scripts/tools.sh helm promtool prometheus_operator source_controller argocd_health kstatus registry node containerd cni_plugins crictl pulumi_old pulumi_mid

export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff" >&2
ruff check .
ruff format --check .
echo "== mypy --strict" >&2
mypy --strict pkobatch
echo "== import-linter" >&2
lint-imports
echo "== pytest" >&2
# Integration and e2e tests fail (never skip) when a real binary is missing.
export CI="${CI:-true}"
set +e
# The slowest tests are listed at the end: where a run's time goes, for keeping CI short.
pytest --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "test.sh: pytest ran no tests; that is a failure" >&2; exit 1; fi
exit $rc
