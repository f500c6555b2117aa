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
# constraints.txt pins every dependency but torch, which $TORCH_SPEC names, and Triton,
# which a CUDA torch pins itself (a CPU torch does not: then the file's Triton is taken).
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
grep -vE '^(torch|triton)==' constraints.txt >"$pins"
case "$target" in
  sidecar)
    "$pip" install --no-cache-dir -c "$pins" -r deploy/requirements-sidecar.txt
    "$pip" install --no-cache-dir -c "$pins" --no-deps .
    ;;
  full)
    # A pinned torch: an unpinned spec resolves to whatever the index has newest.
    "$pip" install --no-cache-dir -c "$pins" "${TORCH_SPEC:-torch==2.11.0}"
    "$pip" show triton >/dev/null 2>&1 || "$pip" install --no-cache-dir -c "$pins" \
      "$(grep -E '^triton==' constraints.txt)"
    "$pip" install --no-cache-dir -c "$pins" .
    ;;
  *)
    echo "usage: $0 sidecar|full VENV" >&2
    exit 2
    ;;
esac
"$venv/bin/triton-warmup" --help >/dev/null
