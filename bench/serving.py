"""Serving after warmup: a trace of random batch sizes through two layers' serving ops.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python bench/serving.py --nproc 2 --out serving.json

Three phases, each in fresh processes (one per rank, started with torchrun):

1. ``warm``: ``warmup.warm`` of a manifest of M buckets for two tensor-parallel layers
   (registry and compile cache in a scratch volume).
2. ``serve``: a new server process: ``Serving`` builds one op per layer from the
   registry, declares itself warm (the compile guard counts from here), then replays a
   trace of calls whose M is drawn at random from 1..max M (rows per rank 1..max M /
   world, most not multiples of 16). Per call: host time until the op returns, and the
   latency until the GPU is done; afterwards every M of the trace again, for its steady
   latency; and a dispatch microbenchmark: the op against the kernel's own launcher with
   the same config, interleaved.
3. ``cold`` (the anchor): the same trace in a fresh process with an empty compile cache
   and no warmup, calling the kernel's launcher with the space's default config.

Every call of the trace is one step of both layers with the same M; one call in 16 is
checked against NCCL + cuBLAS. Prints a table; writes every number to --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

from bench import plots, targets

ROOT = Path(__file__).resolve().parents[1]
LAYERS = "qkv=1536x4096,up=7168x4096"  # name=N per rank x K
BUCKETS = [64, 256, 1024, 4096]  # gathered M tuned at warmup


def layers(spec: str) -> dict[str, tuple[int, int]]:
    """``qkv=1536x4096,up=7168x4096`` -> {name: (N, K)}."""
    pairs = (part.split("=") for part in spec.split(","))
    return {name: (int(nk.split("x")[0]), int(nk.split("x")[1])) for name, nk in pairs}


USER_SHAPES = [256, 1024, 4096]  # rows of the user's @triton.autotune kernel


def manifest_text(world: int, dtype: str, buckets: list[int], spec: str, user: bool) -> str:
    """The layers' buckets; with ``user``, also the user's autotuned kernel (GPU only:
    the interpreter cannot benchmark)."""
    shapes = "".join(
        f"      - {{M: {buckets}, N: {n}, K: {k}}}\n" for n, k in layers(spec).values()
    )
    text = (
        "version: 1\nentries:\n"
        f"  - kernel: ag_gemm\n    dtype: {dtype}\n    world_size: {world}\n"
        f"    policy: tune\n    shapes:\n{shapes}"
    )
    return text + (
        f"  - kernel: bench.serving:user_warm\n    dtype: {dtype}\n    world_size: {world}\n"
        f"    shapes:\n      - {{M: {USER_SHAPES}, N: 1024, K: 1}}\n"
        if user
        else ""
    )


def user_warm(*, shape: dict[str, int], dtype: Any, device: Any) -> Any:
    """A user's kernel behind ``@triton.autotune`` (the manifest's ``module:function``)."""
    import torch

    x = torch.randn(shape["M"], shape["N"], dtype=dtype, device=device)
    out = torch.empty_like(x)
    _scale_rows[(x.shape[0],)](x, out, x.shape[1], 0.5)
    return out


@triton.autotune(
    [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024) for w in (2, 4)],
    key=["n"],
)
@triton.jit
def _scale_rows(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    row = tl.program_id(0)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n)
        tl.store(out_ptr + row * n + cols, x * factor, mask=cols < n)


# ---- the rank processes ----------------------------------------------------------------


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    started = time.perf_counter()
    result = {"warm": warm_phase, "serve": serve_phase, "cold": cold_phase}[args.phase](args)
    result["phase_seconds"] = time.perf_counter() - started
    if dist.get_rank() == 0:
        args.result.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def settings(args: argparse.Namespace) -> Any:
    from warmup.core.settings import Settings

    return Settings(
        volume=args.volume,
        work_dir=args.volume / "work",
        triton_cache_dir=Path(os.environ["TRITON_CACHE_DIR"]),
        manifest=args.volume / "manifest.yaml",
        compile_guard="count",
    )


def warm_phase(args: argparse.Namespace) -> dict[str, Any]:
    import warmup

    status = warmup.warm(args.volume / "manifest.yaml", settings(args))
    return {
        "state": status.state,
        "sources": status.sources,
        "failures": status.failures,
    }


def serve_phase(args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist

    from warmup.serving import Serving

    cache = Path(os.environ["TRITON_CACHE_DIR"])
    started = time.perf_counter()
    with Serving(settings(args)) as serving:
        ops = {
            name: serving.op(
                "ag_gemm", n=n, k=k, dtype=args.dtype, max_m=args.max_m, group=dist.group.WORLD
            )
            for name, (n, k) in layers(args.layers).items()
        }
        built_s = time.perf_counter() - started
        user = user_calls(args)  # the server's own start-up run of its kernels, then warm
        serving.declare_warm()
        files_before = _files(cache)
        result = replay(args, ops)
        result["compiles_during_trace"] = serving.guard.total if serving.guard else None
        result["cache_files_added_during_trace"] = _files(cache) - files_before
        result["ops_built_seconds"] = built_s
        result["buckets"] = {name: list(op.table.buckets) for name, op in ops.items()}
        result["calls_by_source"] = {name: list(op.calls) for name, op in ops.items()}
        result["dispatch"] = dispatch_bench(args, ops)
        after = user_calls(args)
        result["user_kernel"] = {"before_declare_warm": user, "after_declare_warm": after}
    return result


def cold_phase(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from kernels import ag_gemm
    from kernels.adapter import Layer
    from warmup.serving.compile_guard import CompileGuard

    with CompileGuard() as guard:  # no warmup at all: every compile is on the request path
        calls = {}
        for name, (n, k) in layers(args.layers).items():
            served = ag_gemm.ADAPTER.serve(
                Layer(n, k, args.dtype, args.max_m),
                group=dist.group.WORLD,
                device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
            )
            calls[name] = functools.partial(served, served.default_config())
        result = replay(args, calls)
        result["compiles_during_trace"] = guard.total
    result["user_kernel"] = {"no_warmup": user_calls(args)}
    return result


def user_calls(args: argparse.Namespace) -> dict[str, Any] | None:
    """Run the user's autotuned kernel at the manifest's shapes under a counting guard."""
    import torch

    from kernels.adapter import torch_dtype
    from warmup.serving.compile_guard import CompileGuard

    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda")
    with CompileGuard() as guard:
        started = time.perf_counter()
        for rows in USER_SHAPES:
            user_warm(shape={"M": rows, "N": 1024}, dtype=torch_dtype(args.dtype), device=device)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    return {
        "autotune_runs": sum(guard.autotunes.values()),
        "compiles": sum(guard.compiles.values()),
        "seconds": seconds,
    }


def replay(args: argparse.Namespace, calls: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    """The trace, then every M of it again for its steady latency."""
    import torch
    import torch.distributed as dist

    from kernels import ag_gemm
    from kernels.adapter import torch_dtype

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch_dtype(args.dtype)
    rows_max = args.max_m // world
    weights, shards = {}, {}
    for index, (name, (n, k)) in enumerate(layers(args.layers).items()):
        g = torch.Generator(device=device).manual_seed(1000 * index + rank)
        weights[name] = torch.randn(k, n, device=device, dtype=dtype, generator=g) / k**0.5
        shards[name] = torch.randn(rows_max, k, device=device, dtype=dtype, generator=g)
    trace = [random.Random(args.seed + i).randint(1, rows_max) for i in range(args.calls)]
    records, errors, seen = [], [], set()
    for index, rows in enumerate(trace):
        for name, call in calls.items():
            shard = shards[name][:rows]
            mallocs, collected = _device_allocs(device), GC_PAUSES.total_ms
            host, latency, out = _timed(call, shard, weights[name], device)
            mallocs = _device_allocs(device) - mallocs
            gc_ms = GC_PAUSES.total_ms - collected
            slowest_host, most_mallocs = _max_over_ranks([host, mallocs], device)
            first = (name, rows) not in seen
            seen.add((name, rows))
            records.append(
                {
                    "layer": name,
                    "m": rows * world,
                    "host_us": host,
                    "latency_us": latency,
                    "first": first,
                    "slowest_host_us": slowest_host,  # over ranks: a late peer holds all
                    "device_mallocs": int(most_mallocs),  # cudaMallocs, most of any rank
                    "gc_ms": gc_ms,  # Python's collections during the call, this rank
                }
            )
            if index % 16 == 0:
                expected = ag_gemm.reference(shard, weights[name], dist.group.WORLD)
                errors.append(
                    float((out.float() - expected.float()).norm() / expected.float().norm())
                )
    steady = {}
    for name, rows in sorted(seen):
        times = [
            _timed(calls[name], shards[name][:rows], weights[name], device)[1]
            for _ in range(args.steady_reps)
        ]
        steady[(name, rows * world)] = statistics.median(times)
    for record in records:
        record["steady_us"] = steady[(record["layer"], record["m"])]
    return summarize(records, errors, world)


class _GcPauses:
    """The time Python's collector has run in this process since it was installed."""

    def __init__(self) -> None:
        self.total_ms = 0.0
        self._started = 0.0
        import gc

        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_ms += (time.perf_counter() - self._started) * 1e3


GC_PAUSES = _GcPauses()


def _device_allocs(device: Any) -> int:
    """cudaMalloc calls of torch's caching allocator so far (0 off CUDA)."""
    import torch

    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_device_alloc", 0))


def _max_over_ranks(values: list[float], device: Any) -> list[float]:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


@functools.cache
def _lockstep() -> Any:
    """The tuner's meeting of every rank (``warmup.core.collectives.Lockstep.meet``)."""
    import torch.distributed as dist

    from warmup.core.collectives import Lockstep

    return Lockstep(dist.group.WORLD)


def _timed(call: Callable[..., Any], shard: Any, b: Any, device: Any) -> tuple[float, float, Any]:
    """Ranks start together (the GPU drained, then a meeting that releases every rank
    within microseconds: a barrier's wait can release one rank a millisecond after the
    other, and the collective's latency would carry that skew); host time until the
    call returns, latency until the GPU is done."""
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.synchronize()
        _lockstep().meet(what="a call of the trace")
    else:
        dist.barrier()
    started = time.perf_counter()
    out = call(shard, b)
    returned = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    return (returned - started) * 1e6, (done - started) * 1e6, out


def summarize(records: list[dict[str, Any]], errors: list[float], world: int) -> dict[str, Any]:
    firsts = [r for r in records if r["first"]]
    ratios = sorted(r["latency_us"] / r["steady_us"] for r in firsts)
    repeats = [r["latency_us"] / r["steady_us"] for r in records if not r["first"]]
    aligned = sum(1 for r in records if (r["m"] // world) % 16 == 0)
    return {
        "calls": len(records),
        "distinct_m": len(firsts),
        "rows_per_rank_multiple_of_16": aligned,
        "first_over_steady": {
            "median": statistics.median(ratios),
            "p99": _pct(ratios, 99),
            "max": ratios[-1],
            "over_2x": sum(1 for x in ratios if x > 2.0),
        },
        # the noise floor: calls of an M already seen, against the same steady latency
        "repeat_over_steady": {
            "calls": len(repeats),
            "over_2x": sum(1 for x in repeats if x > 2.0),
            "max": max(repeats, default=0.0),
        },
        "worst_first_calls": sorted(firsts, key=lambda r: -r["latency_us"] / r["steady_us"])[:5],
        "calls_with_device_mallocs": sum(1 for r in records if r.get("device_mallocs")),
        "calls_with_gc": sum(1 for r in records if r.get("gc_ms")),
        "first_calls_over_2x_with_gc": sum(
            1 for r in firsts if r["latency_us"] > 2 * r["steady_us"] and r.get("gc_ms")
        ),
        "gc_ms_total": sum(r.get("gc_ms", 0.0) for r in records),
        "first_calls_over_2x_with_device_mallocs": sum(
            1 for r in firsts if r["latency_us"] > 2 * r["steady_us"] and r.get("device_mallocs")
        ),
        "host_us": _stats([r["host_us"] for r in records]),
        "latency_us": _stats([r["latency_us"] for r in records]),
        "max_rel_error": max(errors) if errors else None,
        "checked_calls": len(errors),
    }


def dispatch_bench(args: argparse.Namespace, ops: dict[str, Any]) -> dict[str, Any]:
    """Host time of ``op(...)`` against the kernel's launcher with the op's own config,
    interleaved, same inputs; the GPU drained before each (not timed)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    name, op = next(iter(ops.items()))
    n, k = layers(args.layers)[name]
    device, dtype = op.served.device, op.served.ctx.dtype
    b = torch.randn(k, n, device=device, dtype=dtype)
    shard = torch.randn(args.max_m // world, k, device=device, dtype=dtype)
    rng = random.Random(args.seed)
    through_op, direct = [], []
    for _ in range(args.dispatch_reps):
        rows = rng.randint(1, args.max_m // world)
        a = shard[:rows]
        config = op.config_for(rows * world)
        through_op.append(_timed(op, a, b, device)[0])
        direct.append(_timed(functools.partial(op.served, config), a, b, device)[0])
    op_us, launcher_us = _stats(through_op), _stats(direct)
    return {
        "pick_us": _pick_only(op, a, b, rng, args),
        "op_host_us": op_us,
        "launcher_host_us": launcher_us,
        "dispatch_us": {  # what the op adds: the table pick and its count
            q: op_us[q] - launcher_us[q] for q in ("p50", "p99")
        },
    }


class _NoLaunch:
    """A served layer that launches nothing: timing the op over it times its dispatch."""

    def __init__(self, served: Any) -> None:
        self.kernel, self.rows_step, self.rows = served.kernel, served.rows_step, served.rows

    def __call__(self, config: Any, *inputs: Any, out: Any = None) -> None:
        return None


def _pick_only(op: Any, a: Any, b: Any, rng: random.Random, args: argparse.Namespace) -> Any:
    """The op's own work per call (rows, table pick, count), the launcher stubbed out."""
    served, calls = op.served, list(op.calls)
    op.served = _NoLaunch(served)
    world = op.step
    shards = [a.new_empty(rng.randint(1, args.max_m // world), a.shape[1]) for _ in range(64)]
    times = []
    try:
        for i in range(20000):
            shard = shards[i % 64]
            started = time.perf_counter_ns()
            op(shard, b)
            times.append((time.perf_counter_ns() - started) / 1e3)
    finally:
        op.served, op.calls = served, calls
    return _stats(times)


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": _pct(ordered, 50), "p99": _pct(ordered, 99), "max": ordered[-1]}


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def _files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


# ---- the driver ------------------------------------------------------------------------


def drive(args: argparse.Namespace) -> None:
    import torch

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        for name, value in (
            ("NCCL_NVLS_ENABLE", "0"),
            ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
            ("NVSHMEM_DISABLE_NVLS", "1"),
        ):
            if os.environ.get(name) != value:
                raise SystemExit(f"set {name}={value}: NVLink multicast must stay off")
    scratch = Path(tempfile.mkdtemp(prefix="serving-bench-"))
    volume = scratch / "volume"
    volume.mkdir()
    text = manifest_text(args.nproc, args.dtype, args.buckets, args.layers, on_gpu)
    (volume / "manifest.yaml").write_text(text)
    results = {}
    for phase, cache in (("warm", "cache"), ("serve", "cache"), ("cold", "cold-cache")):
        out = scratch / f"{phase}.json"
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "TRITON_CACHE_DIR": str(scratch / cache), "PYTHONPATH": path}
        env["TRITON_CACHE_AUTOTUNING"] = "1"  # as the chart sets it on the server
        if phase == "cold":
            env.pop("TRITON_CACHE_AUTOTUNING")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(args.nproc),
            str(Path(__file__).resolve()),
            "--phase",
            phase,
            "--volume",
            str(volume),
            "--result",
            str(out),
            *_passed(args),
        ]
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True)
        results[phase] = {
            **json.loads(out.read_text()),
            "process_seconds": time.perf_counter() - started,
        }
        print(f"{phase}: {time.perf_counter() - started:.1f} s", flush=True)
    results["setup"] = {
        "world": args.nproc,
        "dtype": args.dtype,
        "max_m": args.max_m,
        "buckets": args.buckets,
        "layers": args.layers,
        "calls": args.calls,
        "date": time.strftime("%Y-%m-%d"),
        **_versions(),
    }
    if args.out:  # before judging: a judge that fails loses no measurement
        args.out.write_text(json.dumps(results, indent=2))
        plots.save_beside(args.out, "serving", results)
    print(table(results))
    try:
        verdicts = targets.serving(results)
    except (KeyError, TypeError, ValueError) as error:
        print(f"targets not judged: {error!r}")
        return
    print(targets.table(verdicts))
    if args.out:
        results["targets"] = [asdict(v) for v in verdicts]
        args.out.write_text(json.dumps(results, indent=2))


def _passed(args: argparse.Namespace) -> list[str]:
    return [
        "--layers",
        args.layers,
        "--dtype",
        args.dtype,
        "--max-m",
        str(args.max_m),
        "--calls",
        str(args.calls),
        "--seed",
        str(args.seed),
        "--steady-reps",
        str(args.steady_reps),
        "--dispatch-reps",
        str(args.dispatch_reps),
    ]


def _versions() -> dict[str, str]:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def table(results: dict[str, Any]) -> str:
    setup = results["setup"]
    lines = [
        f"{setup['world']} x {setup['gpu']}, {setup['dtype']}, max M {setup['max_m']}, "
        f"buckets {setup['buckets']}, {setup['calls']} steps x layers {setup['layers']}",
        f"{'':8} {'compiles':>9} {'first/steady p50':>17} {'p99':>6} {'max':>7} "
        f"{'>2x':>5} {'host p50':>9} {'host p99':>9} {'lat p50':>8} {'max err':>8}",
    ]
    for phase in ("serve", "cold"):
        r = results[phase]
        f = r["first_over_steady"]
        lines.append(
            f"{phase:8} {r['compiles_during_trace']!s:>9} {f['median']:17.2f} {f['p99']:6.2f} "
            f"{f['max']:7.2f} {f['over_2x']:5d} {r['host_us']['p50']:9.1f} "
            f"{r['host_us']['p99']:9.1f} {r['latency_us']['p50']:8.1f} "
            f"{r['max_rel_error']:8.1e}"
        )
    d = results["serve"]["dispatch"]
    noise = results["serve"]["repeat_over_steady"]
    lines.append(
        f"noise floor (serve): {noise['over_2x']} of {noise['calls']} repeat calls over 2x "
        f"their M's steady latency, max {noise['max']:.2f}"
    )
    lines.append(
        f"op dispatch alone (launcher stubbed): p50 {d['pick_us']['p50']:.2f} us, "
        f"p99 {d['pick_us']['p99']:.2f} us, max {d['pick_us']['max']:.1f} us"
    )
    u = results["serve"]["user_kernel"]
    lines.append(
        f"user @triton.autotune kernel, {len(USER_SHAPES)} shapes: no warmup "
        f"{results['cold']['user_kernel']['no_warmup']}; server start-up "
        f"{u['before_declare_warm']}; after declare_warm {u['after_declare_warm']}"
    )
    lines.append(
        f"dispatch: op host p50/p99 {d['op_host_us']['p50']:.1f}/{d['op_host_us']['p99']:.1f} us, "
        f"launcher {d['launcher_host_us']['p50']:.1f}/{d['launcher_host_us']['p99']:.1f} us, "
        f"added {d['dispatch_us']['p50']:.1f}/{d['dispatch_us']['p99']:.1f} us"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=["warm", "serve", "cold"], default=None)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--volume", type=Path)
    parser.add_argument("--result", type=Path)
    parser.add_argument("--layers", default=LAYERS, help="name=NxK,... (N per rank)")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--max-m", type=int, default=4096)
    parser.add_argument("--buckets", type=lambda s: [int(x) for x in s.split(",")], default=BUCKETS)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steady-reps", type=int, default=5)
    parser.add_argument("--dispatch-reps", type=int, default=1000)
    args = parser.parse_args()
    if args.phase is None:
        drive(args)
    else:
        rank_main(args)


if __name__ == "__main__":
    main()
