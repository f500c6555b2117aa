#!/usr/bin/env bash
# The 4-GPU runs of issue [2.7] on one host, in two device calls of at most 10 minutes:
#
#   bench/four_gpus.sh ag_gemm OUT   # bench/ag_gemm.py at every shape, 4 ranks
#   bench/four_gpus.sh rest OUT      # bench/serving.py at 4 ranks, then bench/fleet.py
#                                    # with four 1-rank pods and with two 2-rank pods
#
# Each bench writes OUT/<name>.json and OUT/<name>.log; each stage ends with the targets
# judged from what it wrote (bench/targets.py). A bench that fails does not stop the
# ones after it; the stage's exit status is then 1. Needs 4 visible GPUs (exit 2
# otherwise) and, for the fleets' Redis mode, a redis-server on PATH or in REDIS_SERVER.
set -u -o pipefail

usage() {
    echo "usage: $0 ag_gemm|rest OUT" >&2
    exit 2
}
[ $# -eq 2 ] || usage
stage=$1
out=$2
case $stage in ag_gemm | rest) ;; *) usage ;; esac

here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

gpus=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ') || gpus=0
seen="nvidia-smi lists $gpus"
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then # the benches see these alone
    gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    seen="CUDA_VISIBLE_DEVICES names $gpus"
fi
if [ "$gpus" -lt 4 ]; then
    echo "$0: needs 4 GPUs of one host; $seen" >&2
    exit 2
fi
mkdir -p "$out"

failed=0
written=()
# run NAME COMMAND...: the bench's output to OUT/NAME.log (INFO lines left out of the
# terminal), its wall time printed; its --out file is OUT/NAME.json.
run() {
    local name=$1
    shift
    local started=$SECONDS
    echo "== $name: $*"
    "$@" --out "$out/$name.json" 2>&1 | tee "$out/$name.log" | { grep -v -E '\bINFO\b' || true; }
    local code=${PIPESTATUS[0]}
    if [ "$code" -eq 0 ]; then
        echo "== $name: done in $((SECONDS - started)) s"
        written+=("$out/$name.json")
    else
        echo "== $name: FAILED (exit $code) after $((SECONDS - started)) s" >&2
        failed=1
    fi
}

redis=${REDIS_SERVER:-$(command -v redis-server || true)}
case $stage in
ag_gemm)
    run ag_gemm_4gpu "$python" -m torch.distributed.run --nproc-per-node 4 \
        "$here/bench/ag_gemm.py"
    ;;
rest)
    run serving_4gpu "$python" "$here/bench/serving.py" --nproc 4
    run fleet_4x1 "$python" "$here/bench/fleet.py" --pods 4 --ranks 1 \
        ${redis:+--redis-server "$redis"}
    run fleet_2x2 "$python" "$here/bench/fleet.py" --pods 2 --ranks 2 \
        ${redis:+--redis-server "$redis"}
    ;;
esac

if [ ${#written[@]} -gt 0 ]; then
    "$python" "$here/bench/targets.py" "${written[@]}" || failed=1
fi
exit $failed
