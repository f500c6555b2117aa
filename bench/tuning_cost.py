"""Tuning cost: native ``triton.autotune`` against our tuner, one GPU, all in one run.

    PYTHONPATH=. python bench/tuning_cost.py --out tuning_cost.json

The same 16-config matmul space (BLOCK_M {64,128} x BLOCK_N {128,256} x BLOCK_K {32,64} x
(stages, warps) {(3,8),(4,4)}, GROUP_M 8) and the same 4 bf16 shapes. Every scenario runs
in a fresh process with its own caches:

    native cold            empty TRITON_CACHE_DIR
    native warm cache      the compile cache of native cold
    native cache_results   second process with Triton's own cache_results=True
    ours cold              empty compile cache, empty registry
    ours warm cache        the compile cache of ours cold, empty registry
    ours warm registry     both from ours cold: a lookup, no benchmark

A scenario's time runs from the first kernel call to the last result (inputs made,
imports done); the process's whole wall time is reported beside it. Then one process
times every config carefully (exhaustive search) to judge both picks.

AllGather-GEMM tuning seconds per shape (2 GPUs):

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python -m torch.distributed.run --nproc-per-node 2 bench/tuning_cost.py --ag-gemm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import plots

SHAPES = [(1024, 4096, 4096), (4096, 4096, 4096), (8192, 3584, 8192), (2048, 6656, 16384)]
AG_SHAPES = [(4096, 6656, 16384), (8192, 3584, 8192), (2048, 4096, 4096), (16384, 7168, 8192)]


def inputs(m: int, n: int, k: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
    return a, b


def scenario_native(cache_results: bool) -> dict[str, Any]:
    import torch
    import triton

    from kernels import matmul

    configs = [
        triton.Config(c.meta, num_warps=c.num_warps, num_stages=c.num_stages)
        for c in matmul.space()
    ]
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"], cache_results=cache_results)(
        matmul._matmul_kernel
    )
    data = [inputs(*shape) for shape in SHAPES]
    outs = [torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=a.dtype) for a, b in data]
    torch.cuda.synchronize()
    started = time.perf_counter()
    picked = []
    for (a, b), c in zip(data, outs, strict=True):
        m, k = a.shape
        n = b.shape[1]

        def grid(meta: dict[str, Any], m: int = m, n: int = n) -> tuple[int]:
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

        tuned[grid](
            a,
            b,
            c,
            m,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            c.stride(0),
            c.stride(1),
        )
        torch.cuda.synchronize()
        best = tuned.best_config
        picked.append(
            {
                "kwargs": dict(best.kwargs),
                "num_warps": best.num_warps,
                "num_stages": best.num_stages,
            }
        )
    return {"seconds": time.perf_counter() - started, "picked": picked}


def scenario_ours(registry: Path, cache_dir: Path) -> dict[str, Any]:
    import torch

    from kernels import matmul
    from registry import Store, detect
    from registry.locks import backend_from_url
    from warmup.tuning.timing import cuda_event_timer
    from warmup.tuning.tuner import TuneOptions, Tuner

    data = [inputs(*shape) for shape in SHAPES]
    torch.cuda.synchronize()
    started = time.perf_counter()
    fingerprint = detect()
    detect_seconds = time.perf_counter() - started
    tuner = Tuner(
        Store(registry, create=True),
        fingerprint,
        timer=cuda_event_timer(),
        lock_backend=backend_from_url(str(registry.parent / "locks")),
        options=TuneOptions(cache_dir=cache_dir),
    )
    rows = []
    for a, b in data:
        task = matmul.MatmulTask(a, b)
        outcome = tuner.get(task)
        matmul.matmul(a, b, outcome.config, out=task.out)  # the launch serving would make
        torch.cuda.synchronize()
        pool = outcome.pool
        rows.append(
            {
                "source": outcome.source,
                "picked": outcome.config.to_json(),
                "benchmark_runs": outcome.benchmark_runs,
                "seconds": outcome.seconds,
                "pool": None
                if pool is None
                else {
                    "compiled": pool.compiled,
                    "failed": len(pool.failed),
                    "workers": pool.workers,
                    "seconds": pool.seconds,
                },
                "cache_files_added_while_timing": outcome.cache_files_added_while_timing,
                "search": []
                if outcome.search is None
                else [
                    (m.config.label(), m.median_ms, m.error) for m in outcome.search.measurements
                ],
            }
        )
    return {
        "seconds": time.perf_counter() - started,
        "detect_seconds": detect_seconds,
        "shapes": rows,
        "benchmark_runs": sum(r["benchmark_runs"] for r in rows),
        "picked": [r["picked"] for r in rows],
    }


def scenario_exhaustive(picks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Every config, every shape, timed carefully; and each pick's careful time."""
    import statistics

    from kernels import matmul
    from registry import KernelConfig
    from warmup.tuning.timing import cuda_event_timer

    timer = cuda_event_timer(warmup=5)
    rows = []
    for index, (a, b) in enumerate(inputs(*shape) for shape in SHAPES):
        task = matmul.MatmulTask(a, b)
        valid = [c for c in task.candidates() if task.verify(task.run(c)) is None]
        samples: dict[Any, list[float]] = {c: [] for c in valid}
        for rotation in range(4):  # interleaved passes: clock drift touches all alike
            for config in valid[rotation:] + valid[:rotation]:
                samples[config] += timer(lambda c=config, t=task: t.run(c), 25)
        times = {c: statistics.median(v) for c, v in samples.items()}
        best = min(times, key=times.get)  # type: ignore[arg-type]
        row = {"shape": SHAPES[index], "best": best.to_json(), "best_ms": times[best]}
        for who, chosen in picks.items():
            config = KernelConfig.from_json(chosen[index])
            row[f"{who}_ms"] = times.get(config, float("inf"))
            row[f"{who}_over_best"] = row[f"{who}_ms"] / times[best]
        rows.append(row)
    return {"rows": rows}


def child(args: argparse.Namespace) -> None:
    which = args.scenario
    if which.startswith("native"):
        result = scenario_native(cache_results=which == "native_cache_results")
    elif which == "exhaustive":
        result = scenario_exhaustive(json.loads(Path(args.picks).read_text()))
    else:
        result = scenario_ours(Path(args.registry), Path(os.environ["TRITON_CACHE_DIR"]))
    print("RESULT " + json.dumps(result), flush=True)


def run_child(
    scenario: str, cache: Path, registry: Path, picks: Path | None = None
) -> dict[str, Any]:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    command = [sys.executable, __file__, "--scenario", scenario, "--registry", str(registry)]
    if picks is not None:
        command += ["--picks", str(picks)]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{scenario} failed:\n{done.stderr[-4000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    result["process_wall_seconds"] = wall
    print(
        f"{scenario:22} {result.get('seconds', 0):7.2f} s in process, {wall:6.2f} s wall",
        flush=True,
    )
    return result


def parent(args: argparse.Namespace) -> None:
    import torch
    import triton

    work = Path(tempfile.mkdtemp(prefix="tuning-cost-"))
    native_cache, cr_cache, ours_cache = work / "native", work / "native-cr", work / "ours"
    registry = work / "registry" / "store"
    results = {
        "native_cold": run_child("native_cold", native_cache, registry),
        "native_warm_cache": run_child("native_warm_cache", native_cache, registry),
        "native_cache_results_first": run_child("native_cache_results", cr_cache, registry),
        "native_cache_results": run_child("native_cache_results", cr_cache, registry),
        "ours_cold": run_child("ours_cold", ours_cache, registry),
        "ours_warm_cache": run_child("ours_warm_cache", ours_cache, work / "empty" / "store"),
        "ours_warm_registry": run_child("ours_warm_registry", ours_cache, registry),
    }
    picks = work / "picks.json"
    picks.write_text(
        json.dumps(
            {"ours": results["ours_cold"]["picked"], "native": results["native_cold"]["picked"]}
        )
    )
    results["exhaustive"] = run_child("exhaustive", ours_cache, registry, picks)
    summary = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
        plots.save_beside(args.out, "tuning_cost", summary)
    print(table(results))


def table(results: dict[str, Any]) -> str:
    native, ours = results["native_cold"]["seconds"], results["ours_cold"]["seconds"]
    lines = ["scenario                 seconds  process wall  benchmark runs"]
    for name in (
        "native_cold",
        "native_warm_cache",
        "native_cache_results",
        "ours_cold",
        "ours_warm_cache",
        "ours_warm_registry",
    ):
        r = results[name]
        runs = r.get("benchmark_runs", "-")
        lines.append(
            f"{name:22} {r['seconds']:9.2f} {r['process_wall_seconds']:13.2f} {runs!s:>15}"
        )
    lines.append(f"cold speedup, ours over native: {native / ours:.2f}x")
    lines.append("shape                   exhaustive best ms  ours/best  native/best")
    for row in results["exhaustive"]["rows"]:
        lines.append(
            f"{','.join(map(str, row['shape'])):22} {row['best_ms']:19.4f} "
            f"{row['ours_over_best']:10.3f} {row['native_over_best']:11.3f}"
        )
    return "\n".join(lines)


def ag_gemm_tuning(args: argparse.Namespace) -> None:
    """Tuning seconds per AllGather-GEMM shape, every rank in lockstep."""
    import torch
    import torch.distributed as dist

    from kernels import ag_gemm
    from registry import Store, detect
    from registry.locks import backend_from_url
    from warmup.core.collectives import Lockstep
    from warmup.tuning.timing import cuda_event_timer
    from warmup.tuning.tuner import TuneOptions, Tuner

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    root = Path(args.registry or tempfile.mkdtemp(prefix="ag-registry-"))
    tuner = Tuner(
        Store(root, create=True),
        detect(),
        timer=cuda_event_timer(),
        lockstep=Lockstep(dist.group.WORLD),
        lock_backend=backend_from_url(str(root.parent / "locks")),
        options=TuneOptions(cache_dir=Path(os.environ.get("TRITON_CACHE_DIR", "/tmp"))),
    )
    rows = []
    for m, n, k in AG_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + rank)
        shard = torch.randn(m // world, k, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
        ctx = ag_gemm.create_context(
            dist.group.WORLD, max_m=m, k=k, dtype=torch.bfloat16, device="cuda"
        )
        task = ag_gemm.AgGemmTask(shard, b, ctx)
        task.configs = task.candidates()[: args.candidates]
        outcome = tuner.get(task)
        pool = outcome.pool
        row = {
            "shape": [m, n, k],
            "seconds": outcome.seconds,
            "source": outcome.source,
            "candidates": len(task.candidates()),
            "benchmark_runs": outcome.benchmark_runs,
            "winner": outcome.config.label(),
            "compile_seconds": pool.seconds if pool else None,
            "compiled_in_pool": pool.compiled if pool else None,
            "cache_files_added_while_timing": outcome.cache_files_added_while_timing,
        }
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0 and args.out:
        args.out.write_text(
            json.dumps(
                {"world": world, "gpu": torch.cuda.get_device_name(), "rows": rows}, indent=2
            )
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--scenario")
    parser.add_argument("--registry")
    parser.add_argument("--picks")
    parser.add_argument("--ag-gemm", action="store_true")
    parser.add_argument("--candidates", type=int, default=16)
    args = parser.parse_args()
    if args.ag_gemm:
        ag_gemm_tuning(args)
    elif args.scenario:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
