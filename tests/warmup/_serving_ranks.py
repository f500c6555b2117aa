"""One rank of a server using a serving op after a warmup: gloo, the interpreter.

Usage: python -m tests.warmup._serving_ranks WORLD RANK INIT_FILE VOLUME WORK
Prints one JSON line: per call, its M, relative error and config; the op's counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from warmup.serving import Serving
from warmup.settings import Settings

N, K, MAX_M = 32, 32, 64


def main(world: int, rank: int, init: str, volume: str, work: str) -> dict[str, object]:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    settings = Settings(
        volume=Path(volume), work_dir=Path(work), device="cpu", compile_guard="strict"
    )
    calls = []
    with Serving(settings, follow=False) as serving:
        op = serving.op(
            "ag_gemm", n=N, k=K, dtype="fp32", max_m=MAX_M, group=dist.group.WORLD, device="cpu"
        )
        serving.declare_warm()
        for m in range(world, MAX_M + 1, world * 5):  # most rows per rank not 16-aligned
            generator = torch.Generator().manual_seed(m)
            a = torch.randn(m, K, generator=generator)
            b = torch.randn(K, N, generator=generator)
            rows = m // world
            out = op(a[rank * rows : (rank + 1) * rows].contiguous(), b)
            expected = a.double() @ b.double()
            error = float((out.double() - expected).norm() / expected.norm())
            calls.append({"m": m, "error": error, "config": op.config_for(m).label()})
        result = {
            "calls": calls,
            "buckets": list(op.table.buckets),
            "counts": op.calls,
            "guard": serving.guard.total if serving.guard else None,
        }
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    world, rank, init, volume, work = sys.argv[1:6]
    print(json.dumps(main(int(world), int(rank), init, volume, work)))
