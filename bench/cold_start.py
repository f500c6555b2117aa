"""Time to ready on 2 GPUs (``--world``) for a manifest of 8 AllGather-GEMM shapes.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python bench/cold_start.py --out cold_start.json

cold:  ``triton-warmup run`` on an empty volume (every shape tuned, compiled, stored)
warm:  ``triton-warmup run`` again, fresh processes and a fresh pod folder (empty
       TRITON_CACHE_DIR, restored from the volume), same volume; ``--repeats`` times
floor: bare rank processes that only launch each shape once with the configs the
       cold run stored, their compile cache filled before the clock starts, then end
       as a warm run's ranks do (no teardown); as often

Each time is the wall time of the whole command, process start to exit; warm and floor
are the medians of their repeats. Printed too: the median warm run's seconds by phase
(its status file, ``warmup.run.phases``), and beside them the median floor's: its
imports (as a warm rank's ``rank_start``), rendezvous, setup (contexts and inputs of
every shape) and launches (against the warm run's compile + check).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench import bytecode, plots
from warmup.core import logs
from warmup.run.phases import OVERLAPPING, phase_table, process_age  # no torch, no triton

SHAPES = [
    (4096, 6656, 16384),
    (8192, 3584, 8192),
    (2048, 4096, 4096),
    (16384, 7168, 8192),
    (1024, 4096, 4096),
    (4096, 4096, 4096),
    (8192, 7168, 8192),
    (2048, 6656, 16384),
]
WORLD = 2
T = TypeVar("T")


def manifest_text(
    shapes: Sequence[tuple[int, int, int]] = SHAPES, world: int = WORLD, dtype: str = "bf16"
) -> str:
    """A manifest of one ag_gemm entry (``bench/fleet.py`` writes its own with it)."""
    rows = "\n".join(f"      - {{M: {m}, N: {n}, K: {k}}}" for m, n, k in shapes)
    return (
        f"version: 1\nentries:\n  - kernel: ag_gemm\n    dtype: {dtype}\n"
        f"    world_size: {world}\n    shapes:\n{rows}\n"
    )


def timed_run(work: Path, pod: str) -> tuple[float, dict[str, Any]]:
    env = {
        **os.environ,
        "TRITON_WARMUP_VOLUME": str(work / "volume"),
        "TRITON_WARMUP_CREATE_VOLUME": "true",
        "TRITON_WARMUP_MANIFEST": str(work / "manifest.yaml"),
        "TRITON_WARMUP_WORK_DIR": str(work / pod),
        "TRITON_WARMUP_DEVICE": "cuda",
    }
    command = [sys.executable, "-m", "warmup", "run"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{pod} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    status = json.loads((work / pod / "status.json").read_text())
    print(f"{pod:6} {seconds:7.2f} s  {done.stdout.strip().splitlines()[-1]}", flush=True)
    return seconds, status


def floor(work: Path, world: int, repeat: int = 0) -> tuple[float, dict[str, float]]:
    """The floor's wall time, and rank 0's seconds by phase (:func:`floor_rank`)."""
    from registry import Store
    from registry.caches import triton_cache

    configs = {}
    for entry in Store(work / "volume" / "registry").entries():
        configs[(entry.key["M"], entry.key["N"], entry.key["K"])] = entry.best.to_json()
    # in SHAPES order: the ranks launch what this process lists, whatever SHAPES they see
    launches = [[*shape, configs[shape]] for shape in SHAPES]
    (work / "configs.json").write_text(json.dumps(launches))
    cache = work / f"floor-cache-{repeat}"
    triton_cache.restore(work / "volume" / "triton-cache", cache)  # before the clock
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--floor-rank", str(work)],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "TRITON_CACHE_DIR": str(cache),
            },
        )
        for r in range(world)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    seconds = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"floor ranks failed: {codes}")
    print(f"floor  {seconds:7.2f} s", flush=True)
    phases = json.loads((work / FLOOR_PHASES).read_text())
    phases["exit"] = max(0.0, time.time() - (work / FLOOR_PHASES).stat().st_mtime)
    return seconds, phases


FLOOR_PHASES = "floor_phases.json"


def floor_rank(work: Path) -> None:
    """Only what serving needs: a context and one launch per shape with a known config.
    Rank 0 writes its seconds by phase to ``FLOOR_PHASES`` in ``work``."""
    import torch
    import torch.distributed as dist

    from kernels import ag_gemm
    from registry import KernelConfig
    from registry.core import atomic

    phases = {"imports": process_age()}  # as a warm rank's rank_start: torch, the kernels

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    started = time.perf_counter()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    phases["rendezvous"] = time.perf_counter() - started

    started = time.perf_counter()
    launches = []
    for m, n, k, config in json.loads((work / "configs.json").read_text()):
        ctx = ag_gemm.create_context(
            dist.group.WORLD, max_m=m, k=k, dtype=torch.bfloat16, device="cuda"
        )
        shard = torch.randn(m // world, k, device="cuda", dtype=torch.bfloat16)  # [M/world, K]
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)  # [K, N]
        launches.append((shard, b, ctx, KernelConfig.from_json(config)))
    torch.cuda.synchronize()
    phases["setup"] = time.perf_counter() - started

    started = time.perf_counter()
    for shard, b, ctx, config in launches:
        ag_gemm.ag_gemm(shard, b, ctx, config)  # compile (or load from the cache), launch
    torch.cuda.synchronize()
    phases["launch"] = time.perf_counter() - started
    phases["total"] = process_age()
    dist.barrier()  # no rank leaves while a peer's last launch still needs it
    if rank == 0:
        atomic.write_json(work / FLOOR_PHASES, phases)
    logs.exit_now(0)  # as a launched warm rank ends: no NCCL and CUDA teardown


# A row of the side-by-side table: the warm run's phases it adds up, the floor's phase
# that does the same work (None: the floor does none of it), and why the warm run may
# spend more there: what it does that the floor does not.
VS_FLOOR: list[tuple[str, tuple[str, ...], str | None, str]] = [
    ("imports", ("imports",), None, "the launcher's own start; the floor has no launcher"),
    ("restore", ("restore",), None, "compile cache copied from the volume (beside the ranks)"),
    (
        "rank_start",
        ("rank_start",),
        "imports",
        "a rank imports pydantic, pydantic-settings and the project besides torch",
    ),
    (
        "rendezvous",
        ("rendezvous",),
        "rendezvous",
        "a rank also waits for the launcher's hand-over, the restore and a barrier",
    ),
    (
        "prepare",
        ("prepare",),
        None,
        "fingerprint (Triton's library hash, which the floor pays at its first compile), tuners",
    ),
    ("setup", ("setup",), "setup", "each shape's reference output, for its check"),
    ("lookup", ("lookup",), None, "registry lookups: the volume, then the remote tier"),
    ("tune", ("tune",), None, "registry misses, tuned"),
    (
        "compile+check",
        ("compile", "check"),
        "launch",
        "each stored config's first launch is checked against NCCL + cuBLAS",
    ),
    ("lock_wait", ("lock_wait",), None, "shapes other pods were tuning"),
    ("exit", ("exit",), "exit", "rank reports, status and metrics written"),
    ("save", ("save",), None, "new compile artifacts copied to the volume"),
]
ABOVE_S = 0.02  # a row this much slower than the floor says why
OTHER_WHY = "in no phase: the launcher between phases, the interpreter's start and end"


def phase_vs_floor(
    warm: dict[str, float], warm_s: float, floor: dict[str, float], floor_s: float
) -> dict[str, dict[str, Any]]:
    """Warm run and floor side by side, phase by phase, in seconds; ``other`` is what no
    phase holds, ``total`` each command's wall time. A row above the floor by more than
    ``ABOVE_S`` says why (``why``)."""
    rows = list(VS_FLOOR)
    listed = {name for _, names, _, _ in rows for name in names}
    rows += [(name, (name,), None, "") for name in warm if name not in listed]  # a newer phase
    table: dict[str, tuple[float, float]] = {}
    whys = {row: why for row, _, _, why in rows} | {"other": OTHER_WHY}
    for row, names, floor_name, _ in rows:
        table[row] = (sum(warm.get(n, 0.0) for n in names), floor.get(floor_name or "", 0.0))
    counted = [v for row, v in table.items() if row not in OVERLAPPING]
    table["other"] = (
        max(0.0, warm_s - sum(w for w, _ in counted)),
        max(0.0, floor_s - sum(f for _, f in counted)),
    )
    table["total"] = (warm_s, floor_s)
    result: dict[str, dict[str, Any]] = {}
    for row, (w, f) in table.items():
        result[row] = {
            "warm_s": round(w, 4),
            "floor_s": round(f, 4),
            "warm_minus_floor_s": round(w - f, 4),
        }
        if w - f > ABOVE_S and whys.get(row):
            result[row]["why"] = whys[row]
    return result


def vs_floor_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'phase':<14} {'warm s':>8} {'floor s':>8} {'warm - floor':>12}  why (if above)"]
    for row, v in rows.items():
        lines.append(
            f"{row:<14} {v['warm_s']:8.2f} {v['floor_s']:8.2f} {v['warm_minus_floor_s']:12.2f}"
            + (f"  {v['why']}" if "why" in v else "")
        )
    return [*lines, f"({', '.join(OVERLAPPING)}: beside rank_start, not in other or total)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--world", type=int, default=WORLD, help="ranks (GPUs)")
    parser.add_argument("--repeats", type=int, default=3, help="warm runs and floors")
    parser.add_argument("--floor-rank", type=Path)
    bytecode.add_option(parser)
    args = parser.parse_args()
    if args.floor_rank:
        floor_rank(args.floor_rank)
        return
    if args.world < 1 or args.repeats < 1:
        parser.error("--world and --repeats take a positive integer")
    bytecode.compile_unless(args.no_bytecode)
    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    (work / "manifest.yaml").write_text(manifest_text(world=args.world))
    cold, cold_status = timed_run(work, "cold")
    warms = [timed_run(work, f"warm-{i}") for i in range(args.repeats)]
    floors = [floor(work, args.world, i) for i in range(args.repeats)]
    warm, warm_status = median_run(warms)
    bottom, floor_phases = median_run(floors)
    vs_floor = phase_vs_floor(warm_status.get("phases", {}), warm, floor_phases, bottom)
    result = {
        "shapes": SHAPES,
        "world": args.world,
        "repeats": args.repeats,
        "cold_s": cold,
        "warm_s": warm,
        "floor_s": bottom,
        "warm_runs_s": [s for s, _ in warms],
        "floor_runs_s": [s for s, _ in floors],
        "warm_over_floor": warm / bottom,
        "cold_sources": cold_status["sources"],
        "warm_sources": warm_status["sources"],
        "warm_benchmark_runs": warm_status["benchmark_runs"],
        "cold_benchmark_runs": cold_status["benchmark_runs"],
        "warm_restored_and_saved": warm_status.get("saved_artifacts"),
        "cold_phases": cold_status.get("phases", {}),
        "warm_phases": warm_status.get("phases", {}),
        "floor_phases": floor_phases,
        "phase_vs_floor": vs_floor,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        plots.save_beside(args.out, "cold_start", result)
    print(
        f"\ncold {cold:.2f} s | warm {warm:.2f} s ({warm_status['benchmark_runs']} "
        f"benchmark runs, {warm_status['sources']}) | floor {bottom:.2f} s | "
        f"warm / floor {warm / bottom:.2f}"
    )
    print(f"warm runs {_seconds(warms)} | floors {_seconds(floors)}")
    print("\nmedian warm run, by phase (total: the command's wall time)")
    print("\n".join(phase_table(warm_status.get("phases", {}), warm)))
    print("\nwarm run against the floor")
    print("\n".join(vs_floor_lines(vs_floor)))


def median_run(runs: list[tuple[float, T]]) -> tuple[float, T]:
    """The run of median wall time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run[0])[(len(runs) - 1) // 2]


def _seconds(runs: list[tuple[float, Any]]) -> str:
    return ", ".join(f"{s:.2f}" for s, _ in runs)


if __name__ == "__main__":
    main()
