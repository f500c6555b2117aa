"""Time to ready on 2 GPUs for a manifest of 8 AllGather-GEMM shapes.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python bench/cold_start.py --out cold_start.json

cold:  ``triton-warmup run`` on an empty volume (every shape tuned, compiled, stored)
warm:  ``triton-warmup run`` again, fresh processes and a fresh pod folder (empty
       TRITON_CACHE_DIR, restored from the volume), same volume
floor: two bare rank processes that only launch each shape once with the configs the
       cold run stored, their compile cache filled before the clock starts

Each time is the wall time of the whole command, process start to exit.
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
from pathlib import Path
from typing import Any

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


def manifest_text() -> str:
    shapes = "\n".join(f"      - {{M: {m}, N: {n}, K: {k}}}" for m, n, k in SHAPES)
    return (
        f"version: 1\nentries:\n  - kernel: ag_gemm\n    dtype: bf16\n"
        f"    world_size: {WORLD}\n    shapes:\n{shapes}\n"
    )


def timed_run(work: Path, pod: str) -> tuple[float, dict[str, Any]]:
    env = {
        **os.environ,
        "TRITON_WARMUP_VOLUME": str(work / "volume"),
        "TRITON_WARMUP_MANIFEST": str(work / "manifest.yaml"),
        "TRITON_WARMUP_WORK_DIR": str(work / pod),
        "TRITON_WARMUP_DEVICE": "cuda",
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "warmup.cli", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{pod} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    status = json.loads((work / pod / "status.json").read_text())
    print(f"{pod:6} {seconds:7.2f} s  {done.stdout.strip().splitlines()[-1]}", flush=True)
    return seconds, status


def floor(work: Path) -> float:
    from registry import Store, triton_cache

    configs = {}
    for entry in Store(work / "volume" / "registry").entries():
        configs[f"{entry.key['M']},{entry.key['N']},{entry.key['K']}"] = entry.best.to_json()
    (work / "configs.json").write_text(json.dumps(configs))
    cache = work / "floor-cache"
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
                "WORLD_SIZE": str(WORLD),
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "TRITON_CACHE_DIR": str(cache),
            },
        )
        for r in range(WORLD)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    seconds = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"floor ranks failed: {codes}")
    print(f"floor  {seconds:7.2f} s", flush=True)
    return seconds


def floor_rank(work: Path) -> None:
    """Only what serving needs: a context and one launch per shape with a known config."""
    import torch
    import torch.distributed as dist

    from kernels import ag_gemm
    from registry import KernelConfig

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    configs = json.loads((work / "configs.json").read_text())
    for m, n, k in SHAPES:
        ctx = ag_gemm.create_context(
            dist.group.WORLD, max_m=m, k=k, dtype=torch.bfloat16, device="cuda"
        )
        shard = torch.randn(m // WORLD, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ag_gemm.ag_gemm(shard, b, ctx, KernelConfig.from_json(configs[f"{m},{n},{k}"]))
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--floor-rank", type=Path)
    args = parser.parse_args()
    if args.floor_rank:
        floor_rank(args.floor_rank)
        return
    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    (work / "manifest.yaml").write_text(manifest_text())
    cold, cold_status = timed_run(work, "cold")
    warm, warm_status = timed_run(work, "warm")
    bottom = floor(work)
    result = {
        "shapes": SHAPES,
        "world": WORLD,
        "cold_s": cold,
        "warm_s": warm,
        "floor_s": bottom,
        "warm_over_floor": warm / bottom,
        "cold_sources": cold_status["sources"],
        "warm_sources": warm_status["sources"],
        "warm_benchmark_runs": warm_status["benchmark_runs"],
        "cold_benchmark_runs": cold_status["benchmark_runs"],
        "warm_restored_and_saved": warm_status.get("saved_artifacts"),
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(
        f"\ncold {cold:.2f} s | warm {warm:.2f} s ({warm_status['benchmark_runs']} "
        f"benchmark runs, {warm_status['sources']}) | floor {bottom:.2f} s | "
        f"warm / floor {warm / bottom:.2f}"
    )


if __name__ == "__main__":
    main()
