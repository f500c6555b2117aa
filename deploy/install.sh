#!/bin/sh
# Install triton-warmup into a virtual environment: the steps the Dockerfile runs, and
# that the tests run again in a fresh environment.
#   deploy/install.sh sidecar VENV   # no torch, no triton: enough for `triton-warmup serve`
#   deploy/install.sh full VENV      # torch ($TORCH_SPEC) and the whole package
set -eu
target="$1"
venv="$2"
python3 -m venv "$venv"
pip="$venv/bin/pip"
case "$target" in
  sidecar)
    "$pip" install --no-cache-dir -r deploy/requirements-sidecar.txt
    "$pip" install --no-cache-dir --no-deps .
    ;;
  full)
    # A pinned torch: an unpinned spec resolves to whatever the index has newest.
    "$pip" install --no-cache-dir "${TORCH_SPEC:-torch==2.11.0}"
    "$pip" install --no-cache-dir .
    ;;
  *)
    echo "usage: $0 sidecar|full VENV" >&2
    exit 2
    ;;
esac
"$venv/bin/triton-warmup" --help >/dev/null
