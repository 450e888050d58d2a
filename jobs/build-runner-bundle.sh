#!/usr/bin/env bash
# Build the injected runner bundle: a directory holding pkobatch's runner frozen by PyInstaller
# (one-dir, jobs/runner_bundle_entry.py), the dynamic loader and C library it was built
# against, and a static launcher (jobs/runner_launcher.c) that starts the one with the other.
# It needs nothing from the image it runs in but the Pulumi CLI and the program's language
# runtime: no particular C library (musl, an older glibc or none), no shell, no writable
# TMPDIR, and nothing is unpacked at start (docs/images.md).
#
#   pkobatch-runner/              the bundle directory (copy all of it)
#     pkobatch-runner             the launcher: the bundle's entry point
#     lib/                        the loader and C library (glibc) of the build machine
#     app/pkobatch-runner         PyInstaller's bootloader
#     app/_internal/              the interpreter, pkobatch and its dependencies
#
#   jobs/build-runner-bundle.sh              build unless cached; print the bundle directory
#   jobs/build-runner-bundle.sh --out DIR    also copy the bundle directory to DIR
#   PYTHON=...                               interpreter with pkobatch[dev] installed
#                                            (default: .venv/bin/python, else python3)
#   PKOBATCH_BUNDLE_CACHE=...                cache root (default ~/.cache/pkobatch/runner-bundle)
#
# The cache key is a hash of everything that goes into the bundle: pkobatch's sources and
# package data, pyproject.toml, this script, the entry point and the launcher, the
# interpreter's version and the exact versions of every installed distribution (`pip
# freeze`). A warm run only hashes. Needs gcc with a static glibc (Debian: gcc, libc6-dev), and
# objdump and readelf (binutils).
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
if ! "$PY" -c 'import pulumi' 2>/dev/null; then
  echo "build-runner-bundle.sh: the Pulumi SDK is not installed for $PY (pip install -e '.[runner,bundle]')" >&2
  exit 1
fi
command -v objdump >/dev/null || { echo "build-runner-bundle.sh: PyInstaller needs objdump (apt-get install binutils)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "build-runner-bundle.sh: the launcher needs gcc and libc6-dev (apt-get install gcc libc6-dev)" >&2; exit 1; }

key=$(
  cd "$here"
  {
    find pkobatch -type f \( -name '*.py' -o -name '*.yaml' -o -name '*.env' -o -name 'py.typed' \) \
      -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum
    sha256sum pyproject.toml jobs/runner_bundle_entry.py jobs/runner_launcher.c jobs/build-runner-bundle.sh
    "$PY" -c 'import platform, sys; print(sys.version, platform.machine())'
    "$PY" -m pip freeze --exclude-editable --disable-pip-version-check
  } | sha256sum | cut -c1-16
)
cache=${PKOBATCH_BUNDLE_CACHE:-$HOME/.cache/pkobatch/runner-bundle}
dir=$cache/$key
# One build at a time per cache: test tiers run side by side (scripts/test.sh), and one build
# must not replace the directory another is reading or writing.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
bundle=$dir/pkobatch-runner
if [ -f "$dir/.stamp" ]; then
  say "cached: $bundle"
else
  say "building $bundle with PyInstaller (one directory)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (
    cd "$work"
    # The development tools installed beside pkobatch are never imported by the runner.
    "$PY" -m PyInstaller --onedir --noconfirm --log-level WARN \
      --name pkobatch-runner \
      --paths "$here" \
      --collect-submodules pulumi \
      --exclude-module mypy --exclude-module hypothesis --exclude-module PyInstaller \
      --distpath "$work/dist" --workpath "$work/build" --specpath "$work" \
      "$here/jobs/runner_bundle_entry.py" >&2
  )
  out_dir=$work/pkobatch-runner
  mkdir -p "$out_dir/lib"
  mv "$work/dist/pkobatch-runner" "$out_dir/app"
  # The C library: the loader the bootloader names, and every library that neither the
  # bundle holds nor the loader is (what PyInstaller leaves to the system: glibc's parts).
  loader=$(readelf -l "$out_dir/app/pkobatch-runner" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
  [ -n "$loader" ] || { echo "build-runner-bundle.sh: no program interpreter in the bootloader" >&2; exit 1; }
  cp -L "$loader" "$out_dir/lib/"
  find "$out_dir/app" -type f \( -name '*.so*' -o -path "$out_dir/app/pkobatch-runner" \) -print0 \
    | xargs -0 -n 1 env LD_LIBRARY_PATH="$out_dir/app/_internal" "$loader" --list 2>/dev/null \
    | awk '$2 == "=>" && $3 == "not" {print "missing:" $1} $2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
    | while read -r library; do
        case "$library" in
          "$out_dir"/*) continue ;;
          missing:*) say "warning: ${library#missing:} is needed by a library of the bundle and found nowhere"; continue ;;
        esac
        case "$(basename "$library")" in
          ld-linux*|libc.so.*|libm.so.*|libmvec.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|libresolv.so.*|libanl.so.*)
            cp -L "$library" "$out_dir/lib/" ;;
          *) echo "build-runner-bundle.sh: $library is needed but is neither in the bundle nor part of glibc" >&2; exit 1 ;;
        esac
      done
  say "building the launcher (static)"
  gcc -static -Os -s -Wall -Wextra -Werror -DBUNDLE_LOADER="\"$(basename "$loader")\"" \
    -o "$out_dir/pkobatch-runner" "$here/jobs/runner_launcher.c"
  say "checking the bundle starts"
  "$out_dir/pkobatch-runner" --version >&2
  mkdir -p "$cache"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  mv "$out_dir" "$dir.tmp/pkobatch-runner"
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.stamp"
fi
if [ -n "$out" ]; then
  rm -rf "$out" && mkdir -p "$(dirname "$out")"
  cp -a "$bundle" "$out"
fi
echo "$bundle"
