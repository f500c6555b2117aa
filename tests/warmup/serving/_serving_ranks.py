"""One rank of a server using a serving op: gloo, the interpreter.

Usage: python -m tests.warmup.serving._serving_ranks WORLD RANK INIT_FILE VOLUME WORK [SCENARIO]
Prints one JSON line. ``serve`` (the default; after a warmup): per call, its M,
relative error and config; the op's counts. ``layers``: a second layer of the process
on the first one's workspace, both called. ``sync``: a registry change of algorithm
that one rank's follower sees first, then ``serving.sync()`` on both ranks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kernels import ag_gemm, startup
from registry import Entry, KernelConfig
from registry.core.fingerprint import detect_for
from warmup.core.settings import Settings
from warmup.serving import Serving, ServingOp

N, K, MAX_M = 32, 32, 64
BASELINE = KernelConfig.make(algorithm="nccl_cublas")
FUSED = KernelConfig.make(
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2},
    algorithm="fused_pull",
    num_warps=4,
    num_stages=2,
)
SYNC_MS = (16, 32, 48)  # M=32 takes M=48's fused config, then its own baseline one


def entry(m: int, config: KernelConfig, world: int = 2) -> Entry:
    """A tuned ag_gemm entry of this layer, under the fingerprint a CPU op looks up."""
    key = ag_gemm.ADAPTER.key(m=m, n=N, k=K, dtype="fp32", world=world)
    fingerprint = detect_for(torch.device("cpu"), ag_gemm.ADAPTER.kernel_hash())
    return Entry.make("ag_gemm", key, fingerprint, config, source="tuned")


def calls(op: ServingOp, ms: Iterable[int], rank: int, world: int) -> list[dict[str, object]]:
    """One call per M, each checked against the float64 reference."""
    done = []
    for m in ms:
        generator = torch.Generator().manual_seed(m)
        a = torch.randn(m, K, generator=generator)
        b = torch.randn(K, N, generator=generator)
        rows = m // world
        out = op(a[rank * rows : (rank + 1) * rows].contiguous(), b)
        expected = a.double() @ b.double()
        error = float((out.double() - expected).norm() / expected.norm())
        done.append({"m": m, "error": error, "config": op.config_for(m).label()})
    return done


def serve(serving: Serving, op: ServingOp, rank: int, world: int) -> dict[str, object]:
    serving.declare_warm()
    ms = range(world, MAX_M + 1, world * 5)  # most rows per rank not 16-aligned
    return {"calls": calls(op, ms, rank, world)}


def sync(serving: Serving, op: ServingOp, rank: int, world: int) -> dict[str, object]:
    serving.declare_warm()
    result: dict[str, Any] = {"before": calls(op, SYNC_MS, rank, world)}
    if rank == 0:  # another pod's tuning lands: M=32 changes algorithm
        serving.store.install([entry(32, BASELINE, world)], record={"bundle": "b2"})
    dist.barrier()
    if rank == 1:  # only this rank's follower has seen it before the next calls
        result["refreshed"] = serving.refresh()
        result["pending"] = op.pending is not None
    result["between"] = calls(op, SYNC_MS, rank, world)  # mismatched collectives if it swapped
    result["synced"] = serving.sync()  # the step boundary: every rank
    result["after"] = calls(op, SYNC_MS, rank, world)
    return result


def layers(serving: Serving, op: ServingOp, rank: int, world: int) -> dict[str, object]:
    """A second layer (its own N and K, fewer bytes of rows) on the first one's
    workspace; calls of both interleaved, each against the reference."""
    n, k = 48, 16
    with startup.recording() as record:
        other = serving.op(
            "ag_gemm", n=n, k=k, dtype="fp32", max_m=MAX_M, group=dist.group.WORLD,
            device="cpu", on_missing="fallback",
        )  # fmt: skip
    serving.declare_warm()
    errors = []
    for m in (2, 48, 64, 22):
        for layer, (layer_n, layer_k) in ((op, (N, K)), (other, (n, k))):
            generator = torch.Generator().manual_seed(m + layer_k)
            a = torch.randn(m, layer_k, generator=generator)
            b = torch.randn(layer_k, layer_n, generator=generator)
            rows = m // world
            out = layer(a[rank * rows : (rank + 1) * rows].contiguous(), b)
            expected = a.double() @ b.double()
            errors.append(float((out.double() - expected).norm() / expected.norm()))
    ctxs = [layer.served.ctx for layer in (op, other)]
    return {
        "second_op": record.counts,
        "one_space": ctxs[0].space is ctxs[1].space,
        "errors": errors,
    }


def main(
    world: int, rank: int, init: str, volume: str, work: str, scenario: str = "serve"
) -> dict[str, object]:
    timeout = timedelta(seconds=120)  # mismatched collectives fail, not hang the test run
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=world, timeout=timeout
    )
    settings = Settings(
        volume=Path(volume), work_dir=Path(work), device="cpu", compile_guard="strict"
    )
    with Serving(settings, follow=False) as serving:
        with startup.recording() as record:
            op = serving.op(
                "ag_gemm", n=N, k=K, dtype="fp32", max_m=MAX_M, group=dist.group.WORLD, device="cpu"
            )
        run = {"serve": serve, "sync": sync, "layers": layers}[scenario]
        result = {"first_op": record.counts, **run(serving, op, rank, world)}
        result.update(
            buckets=list(op.table.buckets),
            counts=op.calls,
            guard=serving.guard.total if serving.guard else None,
        )
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    world, rank, init, volume, work = sys.argv[1:6]
    print(json.dumps(main(int(world), int(rank), init, volume, work, *sys.argv[6:7])))
