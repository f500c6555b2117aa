#!/usr/bin/env bash
# The multi-GPU runs on one host at any world size, each stage short enough for one
# device call of at most 10 minutes:
#
#   bench/multi_gpu.sh N STAGE[,STAGE...] OUT
#
#   ag_gemm       bench/ag_gemm.py, N ranks, at the AllGather-GEMM shapes the example
#                 manifest declares (examples/llama-70b-tp8.yaml, a TP=8 server)
#   ag_gemm_rows  bench/ag_gemm.py, N ranks, at 96 to 16,384 rows (N 7168, K 8192 per rank)
#   rest          bench/cold_start.py --world N, bench/serving.py --nproc N, then
#                 bench/fleet.py with two pods of N/2 ranks
#   pod_ready     bench/pod_ready.py --world N: the AllGather-GEMM MLP, cold, persisted
#                 dirs, a fleet's first pod, a warm fleet's pod, eager
#   all           every stage above, in that order
#
# N is even (the fleet is two pods of N/2 ranks) and at least 2; the host must show N
# GPUs (CUDA_VISIBLE_DEVICES's, else nvidia-smi's), else exit 2 before any bench, and
# the benches see the first N of them. A stage named twice runs once. Each
# bench writes OUT/<name>_<N>gpu.json and OUT/<name>_<N>gpu.log (the fleet:
# OUT/fleet_2x<N/2>.json); the run ends with the targets judged from what it wrote
# (bench/targets.py). A bench that fails does not stop the ones after it; the run's exit
# status is then 1. Extra arguments for every bench/ag_gemm.py call: AG_GEMM_ARGS (for
# example "--iters 45"). The fleet's Redis mode needs a redis-server on PATH or in
# REDIS_SERVER.
set -u -o pipefail

STAGES=(ag_gemm ag_gemm_rows rest pod_ready)
ROWS=(96 192 384 768 1536 3072 6144 12288 16384)
ROWS_NK=7168,8192 # N per rank, K: the example manifest's gate/up projection

usage() {
    echo "usage: $0 N STAGE[,STAGE...] OUT   (N even, >= 2; STAGE: ${STAGES[*]} or all)" >&2
    exit 2
}
[ $# -eq 3 ] || usage
world=$1
out=$3
[[ $world =~ ^[1-9][0-9]*$ ]] && [ "$world" -ge 2 ] && [ $((world % 2)) -eq 0 ] || usage
[[ $2 =~ ^[a-z_]+(,[a-z_]+)*$ ]] || usage
picked=()
IFS=',' read -r -a asked <<<"$2"
for stage in "${asked[@]}"; do
    case " all ${STAGES[*]} " in *" $stage "*) ;; *) usage ;; esac
    [ "$stage" = all ] && named=("${STAGES[@]}") || named=("$stage")
    for one in "${named[@]}"; do # each stage once, in the order first named
        case " ${picked[*]} " in *" $one "*) ;; *) picked+=("$one") ;; esac
    done
done
read -r -a ag_gemm_args <<<"${AG_GEMM_ARGS:-}"

here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then # set, even empty: CUDA sees these alone
    IFS=',' read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
    seen="CUDA_VISIBLE_DEVICES names ${#gpus[@]}"
else
    count=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ') || count=0
    gpus=()
    for ((i = 0; i < count; i++)); do gpus+=("$i"); done
    seen="nvidia-smi lists $count"
fi
if [ ${#gpus[@]} -lt "$world" ]; then
    echo "$0: needs $world GPUs of one host; $seen" >&2
    exit 2
fi
CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${gpus[*]:0:world}") # the first N: every bench's
export CUDA_VISIBLE_DEVICES
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

# ag_gemm NAME ARGS...: bench/ag_gemm.py under torchrun at N ranks.
ag_gemm() {
    local name=$1
    shift
    run "$name" "$python" -m torch.distributed.run --nproc-per-node "$world" \
        "$here/bench/ag_gemm.py" "$@" "${ag_gemm_args[@]}"
}

redis=${REDIS_SERVER:-$(command -v redis-server || true)}
for stage in "${picked[@]}"; do
    case $stage in
    ag_gemm)
        ag_gemm "ag_gemm_${world}gpu" --manifest "$here/examples/llama-70b-tp8.yaml"
        ;;
    ag_gemm_rows)
        shapes=()
        for m in "${ROWS[@]}"; do shapes+=(--shape "$m,$ROWS_NK"); done
        ag_gemm "ag_gemm_rows_${world}gpu" "${shapes[@]}"
        ;;
    rest)
        run "cold_start_${world}gpu" "$python" "$here/bench/cold_start.py" --world "$world"
        run "serving_${world}gpu" "$python" "$here/bench/serving.py" --nproc "$world"
        run "fleet_2x$((world / 2))" "$python" "$here/bench/fleet.py" --pods 2 \
            --ranks $((world / 2)) ${redis:+--redis-server "$redis"}
        ;;
    pod_ready)
        run "pod_ready_${world}gpu" "$python" "$here/bench/pod_ready.py" --world "$world" \
            --models ag_mlp --cases cold,persisted,first_pod,warm_fleet,eager
        ;;
    esac
done

if [ ${#written[@]} -gt 0 ]; then
    "$python" "$here/bench/targets.py" "${written[@]}" || failed=1
fi
exit $failed
