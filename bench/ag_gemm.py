"""AllGather-GEMM against its anchors on one host's GPUs, all in one run.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python -m torch.distributed.run --nproc-per-node 2 bench/ag_gemm.py --out x.json

First a correctness pass on the GPU (TMA and portable consumers, sizes that are not
multiples of the tile, many back-to-back calls with fresh inputs and poisoned outputs),
then for each shape (bf16, N per rank): cuBLAS alone, NCCL all-gather alone,
NCCL + cuBLAS, torch's fused_all_gather_matmul, and ours with the best config of the
pruned, model-ordered space. Every timing: ranks meet at a barrier, L2 is flushed,
device events bracket the op; a repetition's time is the max over ranks; the median
of those is reported. Prints a table last; writes every number to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kernels import ag_gemm
from kernels.spaces import ordered, prune
from registry import KernelConfig

SHAPES = [(4096, 6656, 16384), (8192, 3584, 8192), (2048, 4096, 4096), (16384, 7168, 8192)]
DTYPE = torch.bfloat16
TMA_CHECK = KernelConfig.make(
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3
)
PORTABLE_CHECK = KernelConfig.make(
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=3
)


def log(*parts: object) -> None:
    if dist.get_rank() == 0:
        print(*parts, flush=True)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out.float() - ref).norm() / ref.norm())


def inputs(m: int, n: int, k: int, world: int, rank: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random bf16 inputs, the full A for the references, and this rank's shard."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=DTYPE, generator=g)
    g_b = torch.Generator(device="cuda").manual_seed(seed * 31 + rank)
    b = torch.randn(k, n, device="cuda", dtype=DTYPE, generator=g_b) / k**0.5
    shard = a[rank * (m // world) : (rank + 1) * (m // world)].contiguous()
    return a, b, shard


def check_correctness(world: int, rank: int) -> list[dict[str, Any]]:
    """Both consumers at awkward sizes, many calls back to back, fresh data each time."""
    rows = []
    cases = [
        ("tma", TMA_CHECK, 1024, 1024, 1024),
        ("tma", TMA_CHECK, 1000, 1000, 1000),
        ("tma", TMA_CHECK, 333, 1000, 2048),
        ("tma", TMA_CHECK, 256, 1000, 1001),
        ("portable", PORTABLE_CHECK, 500, 1000, 1000),
        ("portable", PORTABLE_CHECK, 77, 129, 200),
    ]
    for consumer, config, m_rank, n, k in cases:
        ctx = ag_gemm.create_context(
            dist.group.WORLD,
            max_m=world * m_rank,
            k=k,
            dtype=DTYPE,
            device="cuda",
            consumer=consumer,
        )
        worst, unwritten = 0.0, 0
        for call in range(12):
            a, b, shard = inputs(world * m_rank, n, k, world, rank, seed=1000 + call)
            out = torch.full((world * m_rank, n), float("nan"), device="cuda", dtype=DTYPE)
            ag_gemm.ag_gemm(shard, b, ctx, config, out=out)
            unwritten += int((~torch.isfinite(out)).sum())
            worst = max(worst, rel_error(out, a.float() @ b.float()))
        rows.append(
            {
                "consumer": consumer,
                "m_per_rank": m_rank,
                "n": n,
                "k": k,
                "calls": 12,
                "max_rel_error": worst,
                "unwritten": unwritten,
            }
        )
        log(
            f"check {consumer:8} M/rank={m_rank:5} N={n:5} K={k:5}: max rel error "
            f"{worst:.2e} over 12 calls, unwritten {unwritten}"
        )
    return rows


def samples(fn: Callable[[], object], flush: torch.Tensor, iters: int) -> list[float]:
    """Per-repetition times in microseconds, each the max over ranks."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        dist.barrier()
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = torch.tensor(
        [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)], device="cuda"
    )
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def timed(fn: Callable[[], object], flush: torch.Tensor, *, iters: int, warmup: int) -> float:
    """Median over repetitions of the max over ranks, in microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(samples(fn, flush, iters))


def timed_together(
    ops: dict[str, Callable[[], object]],
    flush: torch.Tensor,
    *,
    iters: int,
    warmup: int,
    rounds: int = 3,
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Every op in rotating rounds, so clock drift touches all columns alike: medians
    and p20/p80 by op."""
    for fn in ops.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    names = list(ops)
    pooled: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            pooled[name] += samples(ops[name], flush, max(1, iters // rounds))
    medians = {name: statistics.median(v) for name, v in pooled.items()}
    return medians, {name: percentiles(v) for name, v in pooled.items()}


def percentiles(values: list[float]) -> list[float]:
    """p20 and p80: the spread behind a median."""
    ordered_values = sorted(values)
    return [
        ordered_values[int(0.2 * (len(values) - 1))],
        ordered_values[int(0.8 * (len(values) - 1))],
    ]


def pick_config(
    shard: torch.Tensor,
    b: torch.Tensor,
    ctx: ag_gemm.AgGemmContext,
    ref: torch.Tensor,
    flush: torch.Tensor,
    candidates: int,
) -> dict[str, Any]:
    """The best of the model's top candidates: each compiled, checked, then timed briefly."""
    problem = ag_gemm.problem(shard, b, ctx)
    report = prune(ag_gemm.space(ctx), problem, ctx.limits)
    tried = []
    started = time.perf_counter()
    for config in ordered(report.kept, problem, ctx.limits)[:candidates]:
        out = torch.full_like(ref, float("nan"), dtype=DTYPE)
        try:
            ag_gemm.ag_gemm(shard, b, ctx, config, out=out)
            error = rel_error(out, ref)
            us = (
                timed(
                    lambda c=config, o=out: ag_gemm.ag_gemm(shard, b, ctx, c, out=o),
                    flush,
                    iters=15,
                    warmup=2,
                )
                if error < 2e-2
                else float("inf")
            )
        except Exception as e:  # a config that cannot run scores inf with its reason
            error, us = float("inf"), float("inf")
            log(f"  {config.label()}: failed: {e}")
        tried.append(
            {"config": config.to_json(), "label": config.label(), "us": us, "rel_error": error}
        )
    best = min(tried, key=lambda t: t["us"])
    return {
        "best": best,
        "tried": tried,
        "prune": report.describe(),
        "search_seconds": time.perf_counter() - started,
    }


def bench_shape(
    m: int,
    n: int,
    k: int,
    world: int,
    rank: int,
    flush: torch.Tensor,
    solo: Any,
    args: argparse.Namespace,
) -> dict[str, Any]:
    a, b, shard = inputs(m, n, k, world, rank, seed=m + n + k)
    ref = a.float() @ b.float()
    group = dist.group.WORLD
    ctx = ag_gemm.create_context(group, max_m=m, k=k, dtype=DTYPE, device="cuda")
    search = pick_config(shard, b, ctx, ref, flush, args.candidates)
    best = KernelConfig.from_json(search["best"]["config"])
    gathered = torch.empty(m, k, device="cuda", dtype=DTYPE)
    c = torch.empty(m, n, device="cuda", dtype=DTYPE)
    c_ours = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPE)
    c_solo = torch.empty(m, n, device="cuda", dtype=DTYPE)
    c_in_place = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPE)
    for _ in range(2):  # the "producer" writes the shard into both slots once
        ag_gemm.input_buffer(ctx, shard.shape[0]).copy_(shard)
        ag_gemm.ag_gemm(ag_gemm.input_buffer(ctx, shard.shape[0]), b, ctx, best, out=c_in_place)
    solo_ctx = ag_gemm.create_context(solo, max_m=m, k=k, dtype=DTYPE, device="cuda")

    def nccl_cublas() -> None:
        dist.all_gather_into_tensor(gathered, shard)
        torch.matmul(gathered, b, out=c)

    fused_out = ag_gemm.torch_fused(shard, b, group)
    ops: dict[str, Callable[[], object]] = {
        "cublas": lambda: torch.matmul(a, b, out=c),
        "allgather": lambda: dist.all_gather_into_tensor(gathered, shard),
        "nccl_cublas": nccl_cublas,
        "ours": lambda: ag_gemm.ag_gemm(shard, b, ctx, best, out=c_ours),
        "ours_gemm_alone": lambda: ag_gemm.ag_gemm(a, b, solo_ctx, best, out=c_solo),
        "ours_in_place": lambda: ag_gemm.ag_gemm(
            ag_gemm.input_buffer(ctx, shard.shape[0]), b, ctx, best, out=c_in_place
        ),
    }
    if fused_out is not None:
        ops["torch_fused"] = lambda: ag_gemm.torch_fused(shard, b, group)
    times, p20_p80 = timed_together(ops, flush, iters=args.iters, warmup=args.warmup)
    nccl_cublas()
    errors = {
        "ours": rel_error(c_ours, ref),
        "ours_gemm_alone": rel_error(c_solo, ref),
        "ours_in_place": rel_error(c_in_place, ref),
        "nccl_cublas": rel_error(c, ref),
        "torch_fused": rel_error(fused_out, ref) if fused_out is not None else None,
    }
    floor = max(times["cublas"], times["allgather"])
    return {
        "shape": [m, n, k],
        "world": world,
        "us": times,
        "us_p20_p80": p20_p80,
        "rel_error": errors,
        "speedup_vs_nccl_cublas": times["nccl_cublas"] / times["ours"],
        "ratio_to_floor": times["ours"] / floor,
        "in_place_speedup_vs_nccl_cublas": times["nccl_cublas"] / times["ours_in_place"],
        "in_place_ratio_to_floor": times["ours_in_place"] / floor,
        "vs_torch_fused": (
            times["torch_fused"] / times["ours"] if "torch_fused" in times else None
        ),
        "best": search["best"]["label"],
        "prune": search["prune"],
        "search_seconds": search["search_seconds"],
        "tried": search["tried"],
    }


def table(rows: list[dict[str, Any]], world: int, gpu: str) -> str:
    head = (
        f"{world} x {gpu}, bf16, N per rank; median us (max over ranks), L2 flushed\n"
        f"{'M,N,K':>18} {'cuBLAS':>8} {'AG':>7} {'NCCL+cuBLAS':>12} {'torch fused':>12} "
        f"{'ours':>8} {'speedup':>8} {'/floor':>7} {'vs torch':>9} {'rel err':>8} "
        f"{'GEMM alone':>11} {'in place':>9} {'speedup':>8} {'/floor':>7}  best"
    )
    lines = [head]
    for r in rows:
        t = r["us"]
        fused = f"{t['torch_fused']:12.0f}" if "torch_fused" in t else f"{'n/a':>12}"
        vs = f"{r['vs_torch_fused']:9.2f}" if r["vs_torch_fused"] else f"{'n/a':>9}"
        lines.append(
            f"{','.join(map(str, r['shape'])):>18} {t['cublas']:8.0f} "
            f"{t['allgather']:7.0f} {t['nccl_cublas']:12.0f} {fused} {t['ours']:8.0f} "
            f"{r['speedup_vs_nccl_cublas']:8.2f} {r['ratio_to_floor']:7.2f} {vs} "
            f"{r['rel_error']['ours']:8.1e} {t['ours_gemm_alone']:11.0f} "
            f"{t['ours_in_place']:9.0f} {r['in_place_speedup_vs_nccl_cublas']:8.2f} "
            f"{r['in_place_ratio_to_floor']:7.2f}  {r['best']}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--iters", type=int, default=45)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=12)
    parser.add_argument("--shapes", default="all", help="'all' or indexes like 0,2")
    parser.add_argument("--skip-checks", action="store_true")
    args = parser.parse_args()
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        expected = "0" if name == "NCCL_NVLS_ENABLE" else "1"
        if os.environ.get(name) != expected:
            raise SystemExit(f"set {name}={expected}: NVLink multicast must stay off")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    import triton

    gpu = torch.cuda.get_device_name()
    log(f"{world} x {gpu}; torch {torch.__version__}; triton {triton.__version__}")
    checks = [] if args.skip_checks else check_correctness(world, rank)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # > L2 (60 MB)
    solos = [dist.new_group([r]) for r in range(world)]  # collective: all ranks make all
    picked = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows = []
    for m, n, k in picked:
        row = bench_shape(m, n, k, world, rank, flush, solos[rank], args)
        rows.append(row)
        log(
            f"{m},{n},{k}: ours {row['us']['ours']:.0f} us with {row['best']} "
            f"(search {row['search_seconds']:.1f} s; {row['prune']})"
        )
    result = {
        "gpu": gpu,
        "world": world,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "checks": checks,
        "rows": rows,
    }
    if rank == 0:
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        print(table(rows, world, gpu), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
