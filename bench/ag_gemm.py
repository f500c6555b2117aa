"""AllGather-GEMM: the tuned op against its anchors on one host's GPUs, all in one run.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python -m torch.distributed.run --nproc-per-node 2 bench/ag_gemm.py \\
        --exhaustive --out x.json
    # a second tuning in a fresh process; both runs' winners timed side by side:
    PYTHONPATH=. python -m torch.distributed.run --nproc-per-node 2 bench/ag_gemm.py \\
        --tune-only --compare x.json --out y.json

First a correctness pass on the GPU: every algorithm, both fused consumers, sizes that are
not multiples of the tile, calls of different algorithms back to back on one context,
fresh inputs and NaN-poisoned outputs. Then per shape (bf16, N per rank):

1. the tuner (``warmup.tuning.tuner.Tuner.tune``, the registry left out) searches every
   algorithm's candidates with its own clock, as ``triton-warmup run`` does;
2. the bench times, with its own sampler, the anchors (cuBLAS alone, NCCL all-gather
   alone, NCCL + cuBLAS called directly, torch's fused_all_gather_matmul), the tuned op
   (``ag_gemm`` with the winner), the best config of each algorithm, and the best fused
   config on one rank's data alone ("GEMM alone"); then the GEMM core: the fused
   consumer on one rank's whole A, tuned on its own over the same space, and cuBLAS,
   both replayed from CUDA graphs (no host time in either);
3. with ``--exhaustive``, every candidate the tuner saw, timed the same way.

Every timing repetition: the ranks meet on an idle device, the L2 is flushed, device
events bracket the op; a repetition's time is the max over ranks; ops are timed in
rotating rounds; medians are reported. At decode-like sizes (up to 1024 rows in all)
the fused op, the tuned op and NCCL + cuBLAS are also captured in CUDA graphs and their
replays timed the same way. The tuned op, NCCL + cuBLAS, the best fused config and
the op through its serving layer are timed twice more: with the host ahead
(``us_ahead``): after the flush the device is held for a head start and the ranks'
streams aligned, as the tuner's clock does (``warmup.tuning.timing``), so that these
columns are device time alone and the tuner's recorded time is compared with them;
and issued just in time (``us_just_in_time``): the ranks meet on an idle, flushed
device, and the events bracket the host's issue of the call and its device work, as
the tuner's latency guard times it. The first columns (``us``) sit between the two:
the flush gives the host a head start of its own length (about 70 us on an H200), so
that an op whose host time is about that long is timed in two modes. The host's cost
of one call (``host_us``) is timed apart: calls issued back to back on the host clock;
``--host-profile`` adds where it goes. Prints a table last; writes every number to --out.

``--shape M,N,K`` (repeatable) times shapes of your own instead of the list below;
``--manifest FILE`` the AllGather-GEMM shapes a manifest declares (each once, whatever
world size its entries name), before any ``--shape``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench import plots, targets
from kernels import ag_gemm
from registry import KernelConfig, Store, cpu_fingerprint
from warmup.core.manifest import ManifestError, load_manifest
from warmup.tuning.timing import DeviceHold

SHAPES = [
    (4096, 6656, 16384),
    (8192, 3584, 8192),
    (2048, 4096, 4096),
    (16384, 7168, 8192),
    (256, 7168, 8192),  # a decode batch
    (1024, 7168, 8192),
    (4096, 3584, 8192),
    (8192, 7168, 8192),
    (32768, 1792, 8192),
    (64, 4096, 4096),  # decode batches
    (1024, 4096, 4096),
]
DTYPE = torch.bfloat16
TMA_CHECK = KernelConfig.make(
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
    algorithm=ag_gemm.FUSED,
    num_warps=8,
    num_stages=3,
)
PORTABLE_CHECK = KernelConfig.make(
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8},
    algorithm=ag_gemm.FUSED,
    num_warps=4,
    num_stages=3,
)
LIBRARY = [KernelConfig.make(algorithm=name) for name in ag_gemm.LIBRARY]
GRAPH_ROWS = 1024  # graph columns up to here: decode batches
HOST_TIMED = (
    "tuned",
    "served",
    f"best {ag_gemm.FUSED}",
    "nccl_cublas",
    "graph fused",
    "graph nccl_cublas",
)
AHEAD = ("tuned", "served", "nccl_cublas", f"best {ag_gemm.FUSED}")  # timed with the host ahead
HEAD_START_US = 400.0  # the tuner's (warmup.tuning.timing.cuda_event_timer)
Op = Callable[[], object]


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


def context(group: Any, max_m: int, k: int, consumer: str | None = None) -> ag_gemm.AgGemmContext:
    """An AllGather-GEMM context of the bench's dtype on this rank's GPU (collective)."""
    return ag_gemm.create_context(
        group, max_m=max_m, k=k, dtype=DTYPE, device="cuda", consumer=consumer
    )


def check_correctness(world: int, rank: int) -> list[dict[str, Any]]:
    """Every algorithm at awkward sizes, 12 calls back to back each, fresh data each
    time; then the algorithms in turn on one context (they share its two slots)."""
    rows = []
    cases = [
        ("tma", [TMA_CHECK], 1024, 1024, 1024),
        ("tma", [TMA_CHECK], 1000, 1000, 1000),
        ("tma", [TMA_CHECK], 333, 1000, 2048),
        ("tma", [TMA_CHECK], 256, 1000, 1001),
        ("portable", [PORTABLE_CHECK], 500, 1000, 1000),
        ("portable", [PORTABLE_CHECK], 77, 129, 200),
        *((c.label(), [c], 333, 1000, 2048) for c in LIBRARY),
        *((c.label(), [c], 77, 129, 200) for c in LIBRARY),
        ("mixed", [*LIBRARY, TMA_CHECK], 1000, 1000, 1000),
    ]
    for name, configs, m_rank, n, k in cases:
        consumer = "portable" if name == "portable" else None
        ctx = context(dist.group.WORLD, world * m_rank, k, consumer)
        worst, unwritten = 0.0, 0
        for call in range(12):
            a, b, shard = inputs(world * m_rank, n, k, world, rank, seed=1000 + call)
            out = torch.full((world * m_rank, n), float("nan"), device="cuda", dtype=DTYPE)
            ag_gemm.ag_gemm(shard, b, ctx, configs[call % len(configs)], out=out)
            unwritten += int((~torch.isfinite(out)).sum())
            worst = max(worst, rel_error(out, a.float() @ b.float()))
        rows.append(
            {
                "case": name,
                "m_per_rank": m_rank,
                "n": n,
                "k": k,
                "calls": 12,
                "max_rel_error": worst,
                "unwritten": unwritten,
            }
        )
        log(
            f"check {name:14} M/rank={m_rank:5} N={n:5} K={k:5}: max rel error "
            f"{worst:.2e} over 12 calls, unwritten {unwritten}"
        )
    return rows


def samples(
    fn: Op, flush: torch.Tensor, iters: int, hold: Op | None = None, *, just_in_time: bool = False
) -> list[float]:
    """Per-repetition times in microseconds, each the max over ranks: the ranks meet on
    an idle device, the L2 is flushed (with ``hold``, the device then held while the
    host issues the op, and the ranks' streams aligned), events bracket the op. With
    ``just_in_time`` the ranks meet after the flush instead, the device idle: the events
    bracket the host's issue of the op as well as its device work."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if just_in_time:
            flush.zero_()
            meet()
        else:
            meet()
            flush.zero_()
        if hold is not None:
            hold()
            align()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = torch.tensor(
        [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)], device="cuda"
    )
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


PING: list[torch.Tensor] = []  # align()'s one element, made at its first use


def align() -> None:
    """The ranks' streams met on the devices (the host goes on): after a hold, every
    rank's op starts within microseconds of the others', as the tuner's clock does."""
    if not PING:
        PING.append(torch.zeros(1, device="cuda"))
    dist.all_reduce(PING[0])


def meet() -> None:
    """Every rank released within microseconds, the device idle: a 1-element all-reduce,
    its completion spun on (a barrier's wait may poll at millisecond intervals)."""
    work = dist.all_reduce(torch.zeros(1, device="cuda"), async_op=True)
    while not work.is_completed():
        pass


def timed_together(
    ops: dict[str, Op],
    flush: torch.Tensor,
    *,
    iters: int,
    warmup: int,
    rounds: int = 3,
    hold: Op | None = None,
    just_in_time: bool = False,
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
            pooled[name] += samples(
                ops[name], flush, max(1, iters // rounds), hold, just_in_time=just_in_time
            )
    medians = {name: statistics.median(v) for name, v in pooled.items()}
    return medians, {name: percentiles(v) for name, v in pooled.items()}


def graphed(fn: Op) -> Op:
    """``fn`` captured in a CUDA graph (every rank together: it may be a collective);
    returns the replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def host_us(fn: Op, calls: int = 50, passes: int = 5) -> float:
    """Host microseconds to issue one call: ``calls`` calls back to back on the host
    clock, after the ranks meet on an idle device; the median of ``passes``. 50 calls
    stay well inside the launch queue, so the host never waits for the device."""
    per_pass = []
    for _ in range(passes):
        torch.cuda.synchronize()
        meet()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        per_pass.append((time.perf_counter() - started) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_pass)


def host_profile(fn: Op, calls: int = 200, lines: int = 24) -> list[str]:
    """Where a call's host time goes: cProfile over ``calls`` calls (every rank runs
    them; rank 0's profile is kept), functions by their time with what they call
    (cProfile's own cost inflates every figure alike)."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(lines)
    return [line for line in text.getvalue().splitlines() if line.strip()][-lines - 1 :]


def percentiles(values: list[float]) -> list[float]:
    """p20 and p80: the spread behind a median."""
    ordered_values = sorted(values)
    return [
        ordered_values[int(0.2 * (len(values) - 1))],
        ordered_values[int(0.8 * (len(values) - 1))],
    ]


def tune(task: ag_gemm.AgGemmTask) -> dict[str, Any]:
    """The tuner's search over every algorithm, as a warmup runs it (no registry)."""
    from warmup.core.collectives import Lockstep
    from warmup.tuning.timing import cuda_event_timer, cuda_latency_timer
    from warmup.tuning.tuner import TuneOptions, Tuner

    with tempfile.TemporaryDirectory() as unused_store:
        tuner = Tuner(
            Store(Path(unused_store), create=True),
            cpu_fingerprint(),
            timer=cuda_event_timer(),
            latency_timer=cuda_latency_timer(),
            lockstep=Lockstep(dist.group.WORLD),
            options=TuneOptions(),
        )
        started = time.perf_counter()
        outcome = tuner.tune(task)
    assert outcome.search is not None
    measured = [m for m in outcome.search.measurements if m.ok]
    best_of: dict[str, Any] = {}
    for m in measured:  # fastest first: the first of each algorithm is its best
        best_of.setdefault(ag_gemm.algorithm_of(m.config), m)
    return {
        "winner": outcome.config,
        "recorded_us": outcome.search.best.median_ms * 1e3,
        "seconds": time.perf_counter() - started,
        "repetitions": outcome.benchmark_runs,
        "candidates": len(outcome.search.measurements),
        "best_of": {name: m.config for name, m in best_of.items()},
        "recorded_best_of_us": {name: m.median_ms * 1e3 for name, m in best_of.items()},
        "measured": [m.config for m in measured],
        "notes": outcome.notes,
    }


def bench_shape(
    shape: tuple[int, int, int],
    flush: torch.Tensor,
    solo: Any,
    args: argparse.Namespace,
    previous: dict[str, Any] | None,
) -> dict[str, Any]:
    m, n, k = shape
    world, rank = dist.get_world_size(), dist.get_rank()
    a, b, shard = inputs(m, n, k, world, rank, seed=m + n + k)
    ref = a.float() @ b.float()
    group = dist.group.WORLD
    ctx = context(group, m, k)
    search = tune(ag_gemm.AgGemmTask(shard, b, ctx))
    winner: KernelConfig = search["winner"]
    outs: dict[str, torch.Tensor] = {}

    def ours(name: str, config: KernelConfig, on: Any = ctx, a_in: torch.Tensor = shard) -> Op:
        out = outs.setdefault(name, torch.full((m, n), float("nan"), device="cuda", dtype=DTYPE))
        return lambda: ag_gemm.ag_gemm(a_in, b, on, config, out=out)

    ops: dict[str, Op] = {"tuned": ours("tuned", winner), "served": served_op(shard, b, winner)}
    outs["served"] = ops["served"]()  # type: ignore[assignment]
    if previous is not None:
        ops["previous_winner"] = ours("previous_winner", KernelConfig.from_json(previous))
    fused_best = search["best_of"].get(ag_gemm.FUSED)
    if not args.tune_only:
        gathered = torch.empty(m, k, device="cuda", dtype=DTYPE)
        c = torch.empty(m, n, device="cuda", dtype=DTYPE)

        def nccl_cublas() -> None:
            ag_gemm.ALL_GATHER(gathered, shard)
            torch.matmul(gathered, b, out=c)

        ops |= {
            "cublas": lambda: torch.matmul(a, b, out=c),
            "allgather": lambda: ag_gemm.ALL_GATHER(gathered, shard),
            "nccl_cublas": nccl_cublas,
        }
        if ag_gemm.torch_fused(shard, b, group) is not None:
            ops["torch_fused"] = lambda: ag_gemm.torch_fused(shard, b, group)
        for name, config in search["best_of"].items():
            ops[f"best {name}"] = ours(f"best {name}", config)
        solo_ctx = context(solo, m, k)
        if fused_best is not None:
            ops["fused_gemm_alone"] = ours("fused_gemm_alone", fused_best, solo_ctx, a)
        core = gemm_core(a, b, solo_ctx)
        ops["graph core"] = graphed(ours("graph core", core["config"], solo_ctx, a))
        ops["graph cublas"] = graphed(lambda: torch.matmul(a, b, out=c))
        if m <= GRAPH_ROWS:
            ops["graph nccl_cublas"] = graphed(nccl_cublas)
            ops["graph tuned"] = graphed(ours("graph tuned", winner))
            if fused_best is not None:
                ops["graph fused"] = graphed(ours("graph fused", fused_best))
    host = {name: host_us(ops[name]) for name in HOST_TIMED if name in ops}
    fused_op = ops.get(f"best {ag_gemm.FUSED}")
    profile = host_profile(fused_op) if args.host_profile and fused_op is not None else None
    times, p20_p80 = timed_together(ops, flush, iters=args.iters, warmup=args.warmup)
    ahead_ops = {name: ops[name] for name in AHEAD if name in ops}
    ahead, ahead_p20_p80 = timed_together(
        ahead_ops, flush, iters=args.iters, warmup=args.warmup, hold=DeviceHold(HEAD_START_US)
    )
    jit, jit_p20_p80 = timed_together(
        ahead_ops, flush, iters=args.iters, warmup=args.warmup, just_in_time=True
    )
    exhaustive = timed_exhaustive(search["measured"], ours, flush, args) if args.exhaustive else {}
    row: dict[str, Any] = {
        "shape": [m, n, k],
        "world": world,
        "us": times,
        "us_p20_p80": p20_p80,
        "rel_error": {name: rel_error(out, ref) for name, out in outs.items()},
        "winner": winner.to_json(),
        "algorithm": ag_gemm.algorithm_of(winner),
        "winner_label": winner.label(),
        "us_ahead": ahead,
        "us_ahead_p20_p80": ahead_p20_p80,
        "us_just_in_time": jit,
        "us_just_in_time_p20_p80": jit_p20_p80,
        "tuner_recorded_us": search["recorded_us"],
        "tuner_over_bench": search["recorded_us"] / ahead["tuned"],
        "tuner_over_bench_eager": search["recorded_us"] / times["tuned"],
        "tuning_seconds": search["seconds"],
        "tuner_notes": search["notes"],
        "tuning_repetitions": search["repetitions"],
        "candidates": search["candidates"],
        "tuner_best_of_us": search["recorded_best_of_us"],
        "best_of": {name: c.to_json() for name, c in search["best_of"].items()},
        "host_us": host,
    }
    if profile is not None:
        row["host_profile"] = profile
    if previous is not None:
        row["previous_winner"] = previous
        row["winners_ratio"] = times["previous_winner"] / times["tuned"]
    if not args.tune_only:
        floor = max(times["cublas"], times["allgather"])
        row["speedup_vs_nccl_cublas"] = times["nccl_cublas"] / times["tuned"]
        row["speedup_ahead"] = ahead["nccl_cublas"] / ahead["tuned"]
        row["speedup_just_in_time"] = jit["nccl_cublas"] / jit["tuned"]
        row["served_speedup_ahead"] = ahead["nccl_cublas"] / ahead["served"]
        row["tuned_over_floor"] = times["tuned"] / floor
        if fused_best is not None:
            row["fused_over_floor"] = times[f"best {ag_gemm.FUSED}"] / floor
        if "torch_fused" in times:
            row["torch_fused_over_tuned"] = times["torch_fused"] / times["tuned"]
            if fused_best is not None:
                row["torch_fused_over_fused"] = (
                    times["torch_fused"] / times[f"best {ag_gemm.FUSED}"]
                )
        row["core_over_cublas"] = times["graph core"] / times["graph cublas"]
        row["core_config"] = core["config"].to_json()
        if "graph fused" in times:
            row["graph_speedup_fused"] = times["graph nccl_cublas"] / times["graph fused"]
            row["graph_speedup_tuned"] = times["graph nccl_cublas"] / times["graph tuned"]
    if exhaustive:
        best_label = min(exhaustive, key=lambda label: exhaustive[label]["us"])
        row["exhaustive"] = exhaustive
        row["exhaustive_best"] = {"label": best_label, **exhaustive[best_label]}
        row["tuned_over_exhaustive_best"] = (
            exhaustive[winner.label()]["us"] / exhaustive[best_label]["us"]
        )
    return row


def served_op(shard: torch.Tensor, b: torch.Tensor, config: KernelConfig) -> Op:
    """The op as a server calls it: the kernel's serving layer (``AgGemmServed``, on a
    context of its own) with ``config``, as ``ServingOp`` hands it a call (its pick is
    a list index: ``bench/serving.py`` times it), ``out`` left to the op."""
    from kernels.adapter import Layer

    world = dist.get_world_size()
    layer = Layer(b.shape[1], b.shape[0], "bf16", shard.shape[0] * world)
    served = ag_gemm.AgGemmServed(layer, group=dist.group.WORLD, device=shard.device)
    served.prepare(config, [layer.max_m])
    return lambda: served(config, shard, b)


def gemm_core(a: torch.Tensor, b: torch.Tensor, solo_ctx: Any) -> dict[str, Any]:
    """The GEMM core on its own: the fused consumer on one rank's whole A (no gather),
    its best config from the same space the tuner searches, tuned for this problem."""
    problem = ag_gemm.problem(a, b, solo_ctx)
    fused = [c for c in ag_gemm.candidates(solo_ctx, problem) if c.algorithm == ag_gemm.FUSED]
    search = tune(ag_gemm.AgGemmTask(a, b, solo_ctx, configs=fused))
    return {"config": search["winner"], "seconds": search["seconds"]}


def timed_exhaustive(
    configs: list[KernelConfig],
    ours: Callable[[str, KernelConfig], Op],
    flush: torch.Tensor,
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:
    """Every candidate the tuner saw, each in its own careful run: warm-up, then
    ``args.iters`` repetitions in 3 interleaved passes over all candidates."""
    ops = {c.label(): ours(f"exhaustive {c.label()}", c) for c in configs}
    medians, p20_p80 = timed_together(ops, flush, iters=args.iters, warmup=args.warmup)
    return {
        c.label(): {"config": c.to_json(), "us": medians[c.label()], "p20_p80": p20_p80[c.label()]}
        for c in configs
    }


def table(rows: list[dict[str, Any]], world: int, gpu: str) -> str:
    head = (
        f"{world} x {gpu}, bf16, N per rank; median us (max over ranks), L2 flushed; "
        "x dev and tuner/bench: with the host ahead (device time); x jit: issued just in "
        "time (host and device)\n"
        f"{'M,N,K':>17} {'cuBLAS':>7} {'AG':>6} {'NCCL+cuBLAS':>11} {'torch':>6} "
        f"{'tuned':>7} {'x base':>6} {'x dev':>6} {'x jit':>6} {'tuner us':>8} {'tuner/bench':>11} "
        f"{'fused':>7} "
        f"{'fused/floor':>11} {'/exh':>6}  algorithm (winner)"
    )
    lines = [head]
    for r in rows:
        t = r["us"]
        lines.append(
            f"{','.join(map(str, r['shape'])):>17} {_cell(t, 'cublas', 7)} "
            f"{_cell(t, 'allgather', 6)} {_cell(t, 'nccl_cublas', 11)} "
            f"{_cell(t, 'torch_fused', 6)} {t['tuned']:7.0f} "
            f"{_ratio(r, 'speedup_vs_nccl_cublas', 6)} {_ratio(r, 'speedup_ahead', 6)} "
            f"{_ratio(r, 'speedup_just_in_time', 6)} "
            f"{r['tuner_recorded_us']:8.0f} "
            f"{r['tuner_over_bench']:11.3f} {_cell(t, 'best fused_pull', 7)} "
            f"{_ratio(r, 'fused_over_floor', 11)} {_ratio(r, 'tuned_over_exhaustive_best', 6)}  "
            f"{r['algorithm']} ({r['winner_label']})"
            + (
                f"; previous winner / this: {r['winners_ratio']:.3f}"
                if "winners_ratio" in r
                else ""
            )
        )
    return "\n".join(lines)


def fused_table(rows: list[dict[str, Any]]) -> str:
    """The fused algorithm's own figures: its GEMM core (tuned on its own, replayed from
    a graph) against cuBLAS (likewise), the op against the floor and torch's fused op,
    the host's cost of a call, graph replays."""
    head = (
        f"{'M,N,K':>17} {'core':>6} {'g.cuBLAS':>8} {'ratio':>6} {'fused':>6} {'floor':>6} "
        f"{'/floor':>6} {'torch/':>6} {'host f':>6} {'host b':>6} {'host t':>6} "
        f"{'host s':>6} {'g.fused':>7} "
        f"{'g.tuned':>7} {'g.base':>6} {'g.x':>5}"
    )
    lines = [head]
    for r in rows:
        t, host = r["us"], r.get("host_us", {})
        fused = t.get(f"best {ag_gemm.FUSED}")
        floor = max(t["cublas"], t["allgather"]) if "allgather" in t else None
        lines.append(
            f"{','.join(map(str, r['shape'])):>17} {_cell(t, 'graph core', 6)} "
            f"{_cell(t, 'graph cublas', 8)} {_ratio(r, 'core_over_cublas', 6)} {_num(fused, 6)} "
            f"{_num(floor, 6)} {_ratio(r, 'fused_over_floor', 6)} "
            f"{_ratio(r, 'torch_fused_over_fused', 6)} "
            f"{_num(host.get(f'best {ag_gemm.FUSED}'), 6)} {_num(host.get('nccl_cublas'), 6)} "
            f"{_num(host.get('tuned'), 6)} {_num(host.get('served'), 6)} "
            f"{_cell(t, 'graph fused', 7)} {_cell(t, 'graph tuned', 7)} "
            f"{_cell(t, 'graph nccl_cublas', 6)} {_ratio(r, 'graph_speedup_fused', 5)}"
        )
    return "\n".join(lines)


def _num(value: float | None, width: int, places: int = 0) -> str:
    return f"{value:{width}.{places}f}" if value is not None else f"{'-':>{width}}"


def _cell(times: dict[str, float], name: str, width: int) -> str:
    return f"{times[name]:{width}.0f}" if name in times else f"{'-':>{width}}"


def _ratio(row: dict[str, Any], name: str, width: int) -> str:
    return f"{row[name]:{width}.3f}" if name in row else f"{'-':>{width}}"


def parse_shape(text: str, world: int) -> tuple[int, int, int]:
    """``M,N,K`` as three positive integers, M a multiple of the ranks; exits naming
    what is wrong otherwise."""
    try:
        m, n, k = (int(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"--shape {text!r}: need M,N,K (three integers)") from None
    if min(m, n, k) <= 0 or m % world:
        raise SystemExit(f"--shape {text!r}: need positive sizes, M a multiple of {world}")
    return m, n, k


def manifest_shapes(path: Path, world: int) -> list[tuple[int, int, int]]:
    """The AllGather-GEMM shapes ``path`` declares, in its order, each once (N per rank, as
    in the manifest), timed at this run's world size whatever its entries name; exits
    naming what is wrong: an invalid or unreadable manifest (its error lists every
    problem), no such entry, an entry of a dtype other than the bench's (bf16), an M
    the ranks cannot split."""
    try:
        manifest = load_manifest(path)
    except ManifestError as error:
        raise SystemExit(f"--manifest: {error}") from None
    entries = [entry for entry in manifest.entries if entry.kernel == ag_gemm.NAME]
    if not entries:
        raise SystemExit(f"--manifest {path}: no {ag_gemm.NAME} entry")
    other = sorted({entry.dtype for entry in entries} - {"bf16"})
    if other:
        raise SystemExit(f"--manifest {path}: {other} entries; the bench times bf16 alone")
    shapes = dict.fromkeys(
        (shape["M"], shape["N"], shape["K"]) for entry in entries for shape in entry.expand()
    )
    split = [m for m, _, _ in shapes if m % world]
    if split:
        raise SystemExit(f"--manifest {path}: M {split} not a multiple of {world} ranks")
    return list(shapes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--iters", type=int, default=90)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--shapes", default="all", help="'all' or indexes like 0,2")
    parser.add_argument(
        "--shape", action="append", default=[], help="M,N,K (N per rank); repeatable"
    )
    parser.add_argument("--manifest", type=Path, help="the ag_gemm shapes this manifest declares")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--exhaustive", action="store_true", help="time every candidate too")
    parser.add_argument("--tune-only", action="store_true", help="no anchors: tuned op only")
    parser.add_argument("--compare", type=Path, default=None, help="an earlier run's --out")
    parser.add_argument("--host-profile", action="store_true", help="profile the fused op's host")
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
    picked = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    if args.shape or args.manifest:
        declared = manifest_shapes(args.manifest, world) if args.manifest else []
        picked = declared + [parse_shape(text, world) for text in args.shape]
    checks = [] if args.skip_checks else check_correctness(world, rank)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # > L2 (60 MB)
    solos = [dist.new_group([r]) for r in range(world)]  # collective: all ranks make all
    earlier = {}
    if args.compare is not None:
        earlier = {
            tuple(r["shape"]): r["winner"] for r in json.loads(args.compare.read_text())["rows"]
        }
    result = {
        "gpu": gpu,
        "world": world,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "checks": checks,
        "rows": [],
    }
    for shape in picked:
        row = bench_shape(shape, flush, solos[rank], args, earlier.get(shape))
        result["rows"].append(row)
        log(
            f"{','.join(map(str, shape))}: tuned {row['us']['tuned']:.0f} us with "
            f"{row['winner_label']} (tuner recorded {row['tuner_recorded_us']:.0f} us; "
            f"{row['candidates']} candidates, {row['tuning_repetitions']} repetitions, "
            f"{row['tuning_seconds']:.1f} s)"
        )
        if rank == 0 and args.out:  # after every shape: a run cut short keeps its rows
            args.out.write_text(json.dumps(result, indent=2))
    if rank == 0:
        print(table(result["rows"], world, gpu), flush=True)
        print(fused_table(result["rows"]), flush=True)
        try:  # rank 0 alone: a judge that fails must not keep it from the barrier
            verdicts = targets.ag_gemm(result)
        except (KeyError, TypeError, ValueError) as error:
            print(f"targets not judged: {error!r}", flush=True)
        else:
            print(targets.table(verdicts), flush=True)
            if args.out:
                result["targets"] = [asdict(v) for v in verdicts]
                args.out.write_text(json.dumps(result, indent=2))
        plots.save_beside(args.out, "ag_gemm", result)  # never raises: the barrier is next
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
