#!/usr/bin/env bash
# Run every check and every test (unit, integration against a real control plane, end to
# end with the real Pulumi CLI, the real node). This is the README's test command and what CI
# runs.
#
# On a fresh machine the tools (scripts/tools.sh) take longer to build than the tests take to
# run, so the two overlap: the tools are built in the background in the order the test tiers
# need them, and each tier starts as soon as its own are built (cached tools are only checked):
#
#   stage 1  etcd kubernetes helm promtool prometheus_operator kstatus source_controller
#   stage 2  pulumi yaml
#   stage 3  kubernetes_provider node containerd cni_plugins crictl
#   stage 4  argocd_health registry pulumi_old pulumi_mid
#
#   static checks (ruff, mypy, import-linter)   at once
#   tests/integration, then tests/unit          after stage 1, then after stage 3 (a few unit
#                                               tests need the YAML host and the Kubernetes
#                                               provider)
#   tests/e2e -m "not late_tools", then         after stage 2, then after stage 4 (the tests
#   tests/e2e -m late_tools                     whose fixtures need a tool of stage 3 or 4)
#   tests/node                                  after stage 3 (it builds pkobatch's images,
#                                               whose Pulumi base carries the provider)
#
# The three lines run beside each other. The e2e tier is the longest: splitting it by the
# marker lets most of it run while the Kubernetes provider (the longest build after the
# Kubernetes binaries) is still compiling. The node tier needs every tool of stages 1-3 and
# is mostly waits (image builds, kubelet, containers), so it starts as soon as they exist
# and fills the time the other tiers leave while stage 4 is built.
#
# Every tier runs even when another failed; the script fails when any step did, and a tier in
# which pytest ran no test is a failure. Each tier's and stage's time is printed at the end.
#
#   bash scripts/test.sh                 all of the above
#   bash scripts/test.sh PYTEST_ARGS...  build every tool, then one `pytest PYTEST_ARGS`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
# Integration and e2e tests fail (never skip) when a real binary is missing.
export CI="${CI:-true}"

stages=(
  "etcd kubernetes helm promtool prometheus_operator kstatus source_controller"
  "pulumi yaml"
  "kubernetes_provider node containerd cni_plugins crictl"
  "argocd_health registry pulumi_old pulumi_mid"
)

if [ $# -gt 0 ]; then
  bash scripts/bootstrap.sh --image-builder ${stages[*]}
  export PATH="$PWD/.venv/bin:$PATH"
  set +e
  .venv/bin/pytest --durations=25 "$@"
  rc=$?
  if [ $rc -eq 5 ]; then echo "test.sh: pytest ran no tests; that is a failure" >&2; exit 1; fi
  exit $rc
fi

bash scripts/bootstrap.sh --image-builder --no-tools
export PATH="$PWD/.venv/bin:$PATH"

# Job control gives each background step its own process group, so that stopping it (on an
# error or an interrupt) stops the builds and tests it started.
set -m
work=$(mktemp -d "${TMPDIR:-/tmp}/pkobatch-test.XXXXXX")
background=()
stop_background() {
  local pid
  for pid in "${background[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
}
trap stop_background EXIT
say() { printf '[test.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

# The tools, stage by stage; stage N's marker file says how it ended.
(
  for i in "${!stages[@]}"; do
    n=$((i + 1)) began=$(date +%s)
    # shellcheck disable=SC2086
    if bash scripts/tools.sh ${stages[$i]} >"$work/tools-$n.log" 2>&1; then
      echo "ok $(elapsed "$began")" >"$work/stage-$n"
    else
      echo "failed $(elapsed "$began")" >"$work/stage-$n"
      for ((rest = n + 1; rest <= ${#stages[@]}; rest++)); do echo "skipped" >"$work/stage-$rest"; done
      exit 1
    fi
  done
) &
tools_pid=$!
background+=("$tools_pid")

# Wait for stage $1; print its build output; fail when it (or one before it) failed.
wait_stage() {
  local n=$1
  until [ -f "$work/stage-$n" ]; do
    if ! kill -0 "$tools_pid" 2>/dev/null && [ ! -f "$work/stage-$n" ]; then
      echo "test.sh: the tools build ended before stage $n was built" >&2; return 1
    fi
    sleep 5
  done
  [ -f "$work/tools-$n.log" ] && cat "$work/tools-$n.log" >&2 && rm "$work/tools-$n.log"
  case $(cut -d' ' -f1 "$work/stage-$n") in
    ok) return 0 ;;
    *) echo "test.sh: tools stage $n (${stages[$((n - 1))]}) did not build: see its output above" >&2; return 1 ;;
  esac
}

failures=()
timings=()
# Run one tier: its name, the stage it needs, then pytest's arguments.
tier() {
  local name=$1 stage=$2 began rc
  shift 2
  wait_stage "$stage" || { failures+=("$name (tools)"); return 0; }
  began=$(date +%s)
  say "== pytest $name"
  set +e
  pytest --durations=15 "$@"
  rc=$?
  set -e
  timings+=("$name $(elapsed "$began")")
  if [ $rc -eq 5 ]; then echo "test.sh: pytest ran no tests in $name; that is a failure" >&2; fi
  [ $rc -eq 0 ] || failures+=("$name (pytest exit $rc)")
}

say "== ruff, mypy --strict, import-linter"
began=$(date +%s)
ruff check . || failures+=("ruff check")
ruff format --check . || failures+=("ruff format")
mypy --strict pkobatch || failures+=("mypy")
lint-imports || failures+=("import-linter")
timings+=("static checks $(elapsed "$began")")

# Run a line of tiers (a function calling ``tier``) in the background: its output is kept
# until the end so that the lines' outputs do not interleave.
background_line() {
  local line=$1 run=$2
  (
    timings=() failures=()
    "$run" || true
    for t in "${timings[@]}"; do echo "timing $t"; done >"$work/$line-timings"
    for f in "${failures[@]}"; do echo "$f"; done >"$work/$line-failures"
  ) >"$work/$line.log" 2>&1 &
  lines+=("$line:$!")
  background+=("$!")
}

# Wait for a background line; print its output and take in its timings and failures.
collect_line() {
  local line=${1%%:*} pid=${1#*:} entry
  say "waiting for the $line tier"
  wait "$pid" || true
  cat "$work/$line.log"
  while read -r entry; do timings+=("${entry#timing }"); done <"$work/$line-timings"
  while read -r entry; do [ -n "$entry" ] && failures+=("$entry"); done <"$work/$line-failures"
}

e2e_line() {
  tier e2e 2 -m "not late_tools" tests/e2e
  tier "e2e late_tools" 4 -m late_tools tests/e2e
}
node_line() { tier node 3 tests/node; }

lines=()
background_line e2e e2e_line
background_line node node_line

tier integration 1 tests/integration
tier unit 3 tests/unit

for entry in "${lines[@]}"; do collect_line "$entry"; done
wait_stage 4 >/dev/null 2>&1 || true

say "tools stages:"
for i in "${!stages[@]}"; do echo "  stage $((i + 1)) (${stages[$i]}): $(cat "$work/stage-$((i + 1))")" >&2; done
say "tiers (they overlap):"
for t in "${timings[@]}"; do echo "  $t" >&2; done
say "total $(elapsed "$start")"
rm -rf "$work"
if [ ${#failures[@]} -gt 0 ]; then
  echo "test.sh: FAILED: ${failures[*]}" >&2
  exit 1
fi
say "all checks and tests passed"
