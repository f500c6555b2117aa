"""One rank of the GPU checks of CUDA graphs (torchrun, 2 GPUs or more):

    python -m torch.distributed.run --nproc-per-node 2 -m tests.gpu._graph_ranks OUT.json

Each case captures calls of ``ag_gemm`` once, then replays them 100 times, fresh data
in the captured inputs before every replay and NaN in the outputs, an eager call at
another M on the same context every tenth replay; every result is checked against
float32 NCCL + matmul. Then the same for a serving op built from a registry entry.
Rank 0 writes the results to OUT.json.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.ag_gemm import LIBRARY, PORTABLE_CHECK, TMA_CHECK
from kernels import ag_gemm
from registry import Entry, KernelConfig, Store
from registry.core.fingerprint import detect_for

DTYPE = torch.bfloat16
REPLAYS = 100
CASES: list[tuple[str, list[KernelConfig], str | None, int, int, int]] = [
    ("fused tma", [TMA_CHECK], None, 333, 1000, 2048),
    ("fused portable", [PORTABLE_CHECK], "portable", 77, 129, 200),
    *((c.label(), [c], None, 160, 1000, 1024) for c in LIBRARY),
    ("every algorithm in one graph", [*LIBRARY, TMA_CHECK], None, 256, 512, 1024),
]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out.float() - ref).norm() / ref.norm())


class Inputs:
    """Captured inputs: the same memory every replay, new values each time."""

    def __init__(self, m_per_rank: int, n: int, k: int) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        self.rows = slice(rank * m_per_rank, (rank + 1) * m_per_rank)
        self.m, self.n, self.k = m_per_rank * world, n, k
        self.shard = torch.empty(m_per_rank, k, dtype=DTYPE, device="cuda")
        self.b = torch.empty(k, n, dtype=DTYPE, device="cuda")

    def refill(self, seed: int) -> torch.Tensor:
        """New A (every rank draws the same) and B; returns the float32 reference."""
        gen = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(self.m, self.k, generator=gen, device="cuda", dtype=DTYPE)
        self.shard.copy_(a[self.rows])
        self.b.copy_(torch.randn(self.k, self.n, generator=gen, device="cuda") / self.k**0.5)
        return a.float() @ self.b.float()


def replayed(capture: Any, inputs: Inputs, outs: list[torch.Tensor], eager: Any) -> dict:
    """Capture once, replay REPLAYS times back to back with fresh data and no host sync
    between replays (stream order alone must keep each call's rows apart), each
    replay's outputs copied aside; every tenth replay followed by an eager call. All
    checked at the end against float32 references."""
    inputs.refill(0)
    capture()  # an eager call first: compiles, allocates what a call allocates
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capture()
    results, eager_results = [], []
    for replay in range(1, REPLAYS + 1):
        ref = inputs.refill(replay)
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        results += [(out.clone(), ref) for out in outs]
        if replay % 10 == 0:
            eager_results.append(eager(replay))
    torch.cuda.synchronize()
    worst = max(rel_error(out, ref) for out, ref in results)
    eager_worst = max(rel_error(out, ref) for out, ref in eager_results)
    return {"replays": REPLAYS, "max_rel_error": worst, "eager_max_rel_error": eager_worst}


def eager_call(ctx: Any, config: KernelConfig, inputs: Inputs) -> Any:
    """An eager call between replays, at half the rows, on the same context: its output
    and reference, checked later."""

    def call(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        half = Inputs(max(1, inputs.shard.shape[0] // 2), inputs.n, inputs.k)
        ref = half.refill(10_000 + seed)
        return ag_gemm.ag_gemm(half.shard, half.b, ctx, config), ref

    return call


def calls(ctx: Any, configs: list[KernelConfig], inputs: Inputs, outs: list[Any]) -> None:
    for config, out in zip(configs, outs, strict=True):
        ag_gemm.ag_gemm(inputs.shard, inputs.b, ctx, config, out=out)


def op_cases() -> list[dict[str, Any]]:
    rows = []
    for name, configs, consumer, m_per_rank, n, k in CASES:
        world = dist.get_world_size()
        ctx = ag_gemm.create_context(
            dist.group.WORLD,
            max_m=world * m_per_rank,
            k=k,
            dtype=DTYPE,
            device="cuda",
            consumer=consumer,
        )
        inputs = Inputs(m_per_rank, n, k)
        outs = [torch.empty(inputs.m, n, dtype=DTYPE, device="cuda") for _ in configs]

        capture = functools.partial(calls, ctx, configs, inputs, outs)
        result = replayed(capture, inputs, outs, eager_call(ctx, configs[-1], inputs))
        rows.append({"case": name, **result})
    return rows


def serving_case() -> dict[str, Any]:
    """A serving op whose registry entry names the fused algorithm, captured and replayed."""
    from warmup.core.settings import Settings
    from warmup.serving import Serving

    world, m_per_rank, n, k = dist.get_world_size(), 64, 768, 1024
    device = torch.device("cuda", torch.cuda.current_device())
    with tempfile.TemporaryDirectory() as volume:
        settings = Settings(volume=Path(volume), work_dir=Path(volume) / "work")
        if dist.get_rank() == 0:
            key = ag_gemm.ADAPTER.key(m=world * m_per_rank, n=n, k=k, dtype="bf16", world=world)
            fingerprint = detect_for(device, ag_gemm.kernel_hash())
            Store(settings.paths.registry_dir, create=True).put(
                Entry.make("ag_gemm", key, fingerprint, TMA_CHECK, source="tuned")
            )
        dist.barrier()
        with Serving(settings, follow=False) as serving:
            op = serving.op(
                "ag_gemm",
                n=n,
                k=k,
                dtype="bf16",
                max_m=world * m_per_rank * 2,
                group=dist.group.WORLD,
            )
            inputs = Inputs(m_per_rank, n, k)
            out = torch.empty(inputs.m, n, dtype=DTYPE, device="cuda")

            def eager(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
                half = Inputs(m_per_rank // 2, n, k)
                ref = half.refill(20_000 + seed)
                return op(half.shard, half.b), ref

            result = replayed(lambda: op(inputs.shard, inputs.b, out=out), inputs, [out], eager)
            return {"case": "serving op", "config": op.config_for(inputs.m).label(), **result}


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    try:
        rows = [*op_cases(), serving_case()]
        if dist.get_rank() == 0:
            Path(sys.argv[1]).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
