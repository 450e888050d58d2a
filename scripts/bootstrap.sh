#!/usr/bin/env bash
# Prepare a fresh machine: Debian packages, the project virtualenv, and the real test
# binaries (scripts/tools.sh, cached by version). Idempotent; every step says what it does.
#
#   scripts/bootstrap.sh                      everything the tests need (also buildah and
#                                             mmdebstrap, which build the images)
#   scripts/bootstrap.sh etcd kubernetes ...  only the named scripts/tools.sh components
#   scripts/bootstrap.sh --image-builder etcd ...   and buildah and mmdebstrap
#   scripts/bootstrap.sh --image-builder --no-tools  packages and .venv only (scripts/test.sh
#                                             builds the tools beside the tests)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

image_builder=$([ $# -eq 0 ] && echo yes || echo no)
if [ "${1:-}" = --image-builder ]; then image_builder=yes; shift; fi
build_tools=yes
if [ "${1:-}" = --no-tools ]; then build_tools=no; shift; fi

say() { printf '[bootstrap] %s\n' "$*" >&2; }

missing=()
for tool in git openssl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
command -v go >/dev/null || missing+=(golang-go)
# PyInstaller (the runner bundle, built by the e2e tests) needs objdump and readelf; gcc links
# the bundle's launcher and the real node's pod-sandbox pause statically (glibc's libc.a).
command -v objdump >/dev/null || missing+=(binutils)
command -v gcc >/dev/null || missing+=(gcc)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ "$(uname -m)" != x86_64 ] || missing+=(libc6-dev)
# runc runs the real node's containers and the tests' bundle containers (one of them a musl
# image); ip makes the node's network, iptables holds kube-proxy's and the bridge plugin's
# rules, and the static busybox fills the tests' images.
command -v runc >/dev/null || missing+=(runc)
[ -e /lib/ld-musl-x86_64.so.1 ] || [ "$(uname -m)" != x86_64 ] || missing+=(musl)
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
# pkobatch's images (tests/node, pkobatch/dev/images.py): for the whole test setup and the
# real-node demo, not for the default demo.
if [ "$image_builder" = yes ]; then
  for tool in buildah mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
fi
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "${missing[@]}"
  else echo "bootstrap: please install ${missing[*]} (apt-get install ${missing[*]})" >&2; exit 1; fi
fi

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: Python 3.11 or newer is required (found $("$PY" --version))" >&2; exit 1
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi
say "installing pkobatch and its development tools into .venv"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

[ "$build_tools" = yes ] || exit 0
say "building (or reusing) ${*:-etcd, kube-apiserver, kube-controller-manager, the Pulumi CLI, its YAML host and the Kubernetes provider}"
bash scripts/tools.sh "$@"
