#!/usr/bin/env bash
# Build the runner bundle (jobs/build-runner-bundle.sh) for arm64 on an x86-64 machine and run
# it under qemu-user (docs/images.md, "An arm64 bundle"). PyInstaller cannot cross-build, so
# the bundle is built by an arm64 Python: in an arm64 Debian root made by mmdebstrap, entered
# with chroot, its programs run by qemu-aarch64 through binfmt_misc. Then, on this host and
# outside that root, the arm64 bundle runs `--help`, `job run --help` and an `up` of a YAML
# program with one output and no resources, on a file:// backend, with the Pulumi CLI and the
# YAML language host cross-built for arm64 from the versions scripts/tools.sh builds.
#
#   scripts/arm64-bundle.sh          build what is missing, then run the bundle
#   PKOBATCH_ARM64_CACHE=...         cache root (default ~/.cache/pkobatch-arm64)
#
# Cached, each by a key of its inputs: the arm64 root (root-<key>: suite, packages, apt
# sources), the arm64 Pulumi CLI and YAML host (scripts/tools.sh's cache layout under tools/), and the bundle itself
# (build-runner-bundle.sh's own cache, inside the root). A warm run only hashes, copies this
# checkout into the root and runs the bundle. Each step's time goes to stderr and to
# $CACHE/timings.log.
#
# Needs root, qemu-user-static, mmdebstrap and go; PyPI and Debian's mirror. Not part of
# scripts/test.sh or CI: a cold run adds up to about 80 minutes on 2 busy cores. It leaves the host
# as it found it: binfmt_misc is mounted and qemu-aarch64 registered only for the run, and the
# chroot's mounts are undone on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../pkobatch/dev/versions.env
. "$here/pkobatch/dev/versions.env"
CACHE=${PKOBATCH_ARM64_CACHE:-$HOME/.cache/pkobatch-arm64}
SUITE=bookworm
# What the bundle's build needs in the root (build-runner-bundle.sh: gcc with a static glibc,
# binutils; PyInstaller: a shared libpython).
ROOT_PACKAGES=python3,python3-venv,python3-dev,libpython3.11,gcc,libc6-dev,binutils,ca-certificates,git
BINFMT=/proc/sys/fs/binfmt_misc
BINFMT_RECIPE=/usr/share/binfmts/qemu-aarch64
# The heavy steps yield to everything else on the machine.
heavy=(nice -n 19 ionice -c3)

say() { printf '[arm64-bundle %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { echo "arm64-bundle.sh: $*" >&2; exit 1; }
timed() {
  local label=$1 start=$SECONDS
  shift
  "$@"
  say "$label: $((SECONDS - start)) s"
  printf '%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$label" "$((SECONDS - start))" >>"$CACHE/timings.log"
}

[ "$(id -u)" = 0 ] || fail "needs root (mmdebstrap, chroot, binfmt_misc)"
[ "$(uname -m)" = x86_64 ] || fail "meant for an x86-64 host; on arm64 run jobs/build-runner-bundle.sh"
for tool in mmdebstrap go chroot; do
  command -v "$tool" >/dev/null || fail "'$tool' is required (apt-get install mmdebstrap; Go from scripts/bootstrap.sh)"
done
[ -f "$BINFMT_RECIPE" ] || fail "no $BINFMT_RECIPE: apt-get install qemu-user-static"
mkdir -p "$CACHE/tools"

# -- Undone on exit ---------------------------------------------------------------------------
mounted_binfmt=""
registered_binfmt=""
chroot_mounts=()
run_dir=""
cleanup() {
  local index
  if [ -n "$run_dir" ]; then rm -rf "$run_dir"; fi
  for ((index = ${#chroot_mounts[@]} - 1; index >= 0; index--)); do
    umount "${chroot_mounts[index]}" || umount -l "${chroot_mounts[index]}" || true
  done
  if [ -n "$registered_binfmt" ]; then echo -1 >"$BINFMT/qemu-aarch64" || true; fi
  if [ -n "$mounted_binfmt" ]; then umount "$BINFMT" || true; fi
}
trap cleanup EXIT

# qemu-aarch64 for arm64 ELF files, with Debian's magic, mask and interpreter. F opens the
# interpreter now, so it also runs inside the chroot, which has no qemu of its own.
register_qemu() {
  if [ ! -f "$BINFMT/status" ]; then
    mount -t binfmt_misc binfmt_misc "$BINFMT"
    mounted_binfmt=1
  fi
  if [ -f "$BINFMT/qemu-aarch64" ]; then
    say "qemu-aarch64 is registered already: $(sed -n 's/^interpreter //p' "$BINFMT/qemu-aarch64")"
    return
  fi
  local field interpreter magic mask flags=F
  field() { sed -n "s/^$1 //p" "$BINFMT_RECIPE"; }
  interpreter=$(field interpreter)
  magic=$(field magic)
  mask=$(field mask)
  if [ "$(field preserve)" = yes ]; then flags=PF; fi
  printf ':qemu-aarch64:M:0:%s:%s:%s:%s' "$magic" "$mask" "$interpreter" "$flags" >"$BINFMT/register"
  registered_binfmt=1
}

# -- The Pulumi CLI and the YAML host for arm64 ------------------------------------------------
# scripts/tools.sh's own pulumi and yaml components with GOARCH=arm64, into this cache only
# (the module and build caches are shared). PATH holds only go and the system's tools, so
# that tools.sh does not link an x86-64 pulumi it finds instead of building one; its check
# of the built CLI's version runs under qemu.
build_pulumi_tools() {
  local go_dir
  go_dir=$(dirname "$(command -v go)")
  env GOARCH=arm64 GOOS=linux PKOBATCH_TOOLS_DIR="$CACHE/tools" PATH="$go_dir:/usr/bin:/bin" \
    "${heavy[@]}" bash "$here/scripts/tools.sh" pulumi yaml
}

# -- The arm64 root ----------------------------------------------------------------------------
# This machine's apt sources (as pkobatch/dev/images.py uses them), else mmdebstrap's default.
apt_sources() {
  local file
  for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    if [ -s "$file" ] && grep -q "$SUITE" "$file"; then printf '%s\n' "$file"; fi
  done
}

root_key() {
  {
    printf '%s\n' "$SUITE" "$ROOT_PACKAGES"
    sed -n '/^# -- The arm64 root/,/^# -- The bundle/p' "${BASH_SOURCE[0]}"
    apt_sources | while read -r file; do cat "$file"; done
  } | sha256sum | cut -c1-16
}

make_root() {
  local root=$1 sources
  mapfile -t sources < <(apt_sources)
  rm -rf "$root.tmp"
  "${heavy[@]}" mmdebstrap --arch=arm64 --variant=apt --format=directory \
    --include="$ROOT_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --skip=output/dev \
    "$SUITE" "$root.tmp" "${sources[@]}"
  rm -rf "$root" && mv "$root.tmp" "$root" && touch "$root/.stamp"
}

# -- The bundle --------------------------------------------------------------------------------
enter_root() {
  local root=$1 target
  for target in proc dev sys; do
    mkdir -p "$root/$target"
    case $target in
      proc) mount -t proc proc "$root/proc" ;;
      *) mount --bind "/$target" "$root/$target" ;;
    esac
    chroot_mounts+=("$root/$target")
  done
  # pip reaches PyPI with this machine's name servers and certificates (a TLS-inspecting
  # proxy's too).
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/pkobatch-host-ca.crt"
}

in_root() {
  local root=$1
  shift
  "${heavy[@]}" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/pkobatch-host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=180 "$(command -v chroot)" "$root" "$@"
}

# This checkout as git sees it (tracked and untracked, not ignored: no .venv) at /src/pkobatch.
copy_checkout() {
  local root=$1
  rm -rf "$root/src/pkobatch" && mkdir -p "$root/src/pkobatch"
  git -C "$here" ls-files -z --cached --others --exclude-standard \
    | (cd "$here" && tar --null --files-from=- --ignore-failed-read -cf -) \
    | tar -C "$root/src/pkobatch" -xf -
}

# The venv is kept in the root while pyproject.toml is unchanged (pip install -e: the copied
# sources are read in place).
install_venv() {
  local root=$1 key
  key=$(sha256sum "$here/pyproject.toml" | cut -c1-16)
  if [ "$(cat "$root/opt/venv/.pkobatch-key" 2>/dev/null)" = "$key" ]; then return; fi
  rm -rf "$root/opt/venv"
  in_root "$root" python3 -m venv /opt/venv
  in_root "$root" /opt/venv/bin/pip install -q -e '/src/pkobatch[runner,bundle]'
  echo "$key" >"$root/opt/venv/.pkobatch-key"
}

build_bundle() {
  local root=$1
  in_root "$root" env PYTHON=/opt/venv/bin/python PKOBATCH_BUNDLE_CACHE=/var/cache/pkobatch-runner-bundle \
    bash /src/pkobatch/jobs/build-runner-bundle.sh --out /out/pkobatch-runner >/dev/null
}

# -- The runs, on this host ---------------------------------------------------------------------
# The bundle runs outside the root: nothing of arm64 is on this host but what it carries.
run_bundle() {
  local bundle=$1 tools=$2 work
  run_dir=$(mktemp -d)
  work=$run_dir
  file -L "$bundle/pkobatch-runner" "$bundle/app/pkobatch-runner" "$(PATH=$tools command -v pulumi)" >&2
  say "pkobatch-runner --help"
  "$bundle/pkobatch-runner" --help >"$work/help.txt"
  grep -q '^  run ' "$work/help.txt" || fail "--help lists no 'run' command: $(cat "$work/help.txt")"
  say "pkobatch-runner job run --help"
  "$bundle/pkobatch-runner" job run --help >"$work/job-run-help.txt"
  grep -q -- '--snapshot' "$work/job-run-help.txt" || fail "job run --help names no --snapshot"

  mkdir -p "$work/program" "$work/backend" "$work/home"
  cat >"$work/program/Pulumi.yaml" <<'EOF'
name: arm64-bundle
runtime: yaml
outputs:
  greeting: hello from arm64
EOF
  cat >"$work/stack.yaml" <<EOF
apiVersion: pulumi.com/v1
kind: Stack
metadata: {name: arm64-bundle, namespace: default}
spec:
  stack: dev
  workspaceTemplate: {spec: {local: {dir: $work/program}}}
EOF
  # The runner scrubs the passphrase from everything it writes (an output holding it reads
  # "[secret]"): it must not occur in the program's output or paths.
  local attempt
  for attempt in first no-change; do
    say "pkobatch-runner run (up, $attempt)"
    env -i PATH="$tools:/usr/bin:/bin" HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 \
      PULUMI_HOME="$work/home/.pulumi" PULUMI_BACKEND_URL="file://$work/backend" \
      PULUMI_CONFIG_PASSPHRASE=throwaway-passphrase PULUMI_SKIP_UPDATE_CHECK=true \
      PKOBATCH_CACHE_DIR="$work/cache" \
      "${heavy[@]}" "$bundle/pkobatch-runner" run -f "$work/stack.yaml" -o json >"$work/result-$attempt.json"
    python3 - "$work/result-$attempt.json" <<'EOF'
import json, sys
result = json.load(open(sys.argv[1]))
summary = {k: result.get(k) for k in ("operation", "state", "reason", "outputs", "changes", "pulumiVersion")}
print(json.dumps(summary), file=sys.stderr)
if result.get("state") != "succeeded" or result.get("outputs", {}).get("greeting") != "hello from arm64":
    sys.exit(f"arm64-bundle.sh: the run did not succeed with the output: {result.get('message')}")
EOF
  done
  rm -rf "$work"
}

# -- Main ---------------------------------------------------------------------------------------
timed "register qemu-aarch64 (binfmt_misc)" register_qemu

root=$CACHE/root-$(root_key)
if [ -f "$root/.stamp" ]; then say "cached: $root"; else
  timed "mmdebstrap the arm64 root" make_root "$root"
fi
timed "enter the root" enter_root "$root"
timed "copy this checkout into the root" copy_checkout "$root"
timed "install pkobatch[runner,bundle] in the root (pip)" install_venv "$root"
timed "build the bundle in the root (build-runner-bundle.sh)" build_bundle "$root"
timed "cross-build the Pulumi CLI and the YAML host (GOARCH=arm64)" build_pulumi_tools
tools=$CACHE/tools/pulumi-$PULUMI_VERSION:$CACHE/tools/yaml-$PULUMI_YAML_VERSION

timed "run the bundle on this host under qemu" run_bundle "$root/out/pkobatch-runner" "$tools"
say "done: $root/out/pkobatch-runner"
