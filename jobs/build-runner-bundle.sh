#!/usr/bin/env bash
# Build the injected runner bundle: a PyInstaller one-file executable of pkobatch's runner
# (jobs/runner_bundle_entry.py) that needs nothing from the image it runs in but glibc, a
# writable TMPDIR, the Pulumi CLI and the program's language runtime (docs/images.md).
#
#   jobs/build-runner-bundle.sh              build unless cached; print the bundle's path
#   jobs/build-runner-bundle.sh --out FILE   also copy the bundle to FILE
#   PYTHON=...                               interpreter with pkobatch[dev] installed
#                                            (default: .venv/bin/python, else python3)
#   PKOBATCH_BUNDLE_CACHE=...                cache root (default ~/.cache/pkobatch/runner-bundle)
#
# The cache key is a hash of everything that goes into the bundle: pkobatch's sources and
# package data, pyproject.toml, this script, the entry point, the interpreter's version and
# the exact versions of every installed distribution (`pip freeze`). A warm run only hashes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    *) echo "build-runner-bundle.sh: unknown argument $1 (usage: [--out FILE])" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$here/.venv/bin/python" ]; then PY=$here/.venv/bin/python; else PY=python3; fi
fi
say() { printf '[runner-bundle %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
if ! "$PY" -c 'import PyInstaller' 2>/dev/null; then
  echo "build-runner-bundle.sh: PyInstaller is not installed for $PY (pip install -e '.[dev]')" >&2
  exit 1
fi
command -v objdump >/dev/null || { echo "build-runner-bundle.sh: PyInstaller needs objdump (apt-get install binutils)" >&2; exit 1; }

key=$(
  cd "$here"
  {
    find pkobatch -type f \( -name '*.py' -o -name '*.yaml' -o -name '*.env' -o -name 'py.typed' \) \
      -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum
    sha256sum pyproject.toml jobs/runner_bundle_entry.py jobs/build-runner-bundle.sh
    "$PY" -c 'import platform, sys; print(sys.version, platform.machine())'
    "$PY" -m pip freeze --exclude-editable --disable-pip-version-check
  } | sha256sum | cut -c1-16
)
cache=${PKOBATCH_BUNDLE_CACHE:-$HOME/.cache/pkobatch/runner-bundle}
dir=$cache/$key
bundle=$dir/pkobatch-runner
if [ -f "$dir/.stamp" ]; then
  say "cached: $bundle"
else
  say "building $bundle with PyInstaller (one file)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (
    cd "$work"
    "$PY" -m PyInstaller --onefile --noconfirm --log-level WARN \
      --name pkobatch-runner \
      --paths "$here" \
      --collect-submodules pulumi \
      --distpath "$work/dist" --workpath "$work/build" --specpath "$work" \
      "$here/jobs/runner_bundle_entry.py" >&2
  )
  say "checking the bundle starts"
  "$work/dist/pkobatch-runner" --version >&2
  mkdir -p "$cache"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  mv "$work/dist/pkobatch-runner" "$dir.tmp/pkobatch-runner"
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.stamp"
fi
if [ -n "$out" ]; then
  mkdir -p "$(dirname "$out")"
  cp "$bundle" "$out"
fi
echo "$bundle"
