"""One rank of the CPU AllGather-GEMM tests: gloo, the interpreter, a float64 reference.

Usage: python -m tests.kernels._ag_gemm_ranks WORLD RANK INIT_FILE SCENARIO[:ARGUMENT]
Prints one JSON line: the results the test asserts on.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kernels import ag_gemm
from kernels import ag_gemm_workspace as workspace
from registry import KernelConfig

TILE = KernelConfig.make({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2})
SHAPES = [(5, 23, 19), (16, 40, 32), (7, 9, 33)]  # (M per rank, N, K): odd, even, odd


def _gathered(world: int, shard_shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Every rank can rebuild the whole A from the seed: the reference needs no gather."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(world * shard_shape[0], shard_shape[1], generator=g)


def correctness(world: int, rank: int) -> dict[str, object]:
    errors = []
    for index, (m_per_rank, n, k) in enumerate(SHAPES):
        ctx = ag_gemm.create_context(None, max_m=world * 16, k=k, dtype=torch.float32, device="cpu")
        for call in range(2):  # back to back on one context
            seed = 1000 * index + call
            a = _gathered(world, (m_per_rank, k), seed)
            b = torch.randn(k, n, generator=torch.Generator().manual_seed(seed + 7))
            shard = a[rank * m_per_rank : (rank + 1) * m_per_rank].contiguous()
            out = torch.full((world * m_per_rank, n), float("nan"))
            ag_gemm.ag_gemm(shard, b, ctx, TILE, out=out)
            expected = a.double() @ b.double()
            written = bool(torch.isfinite(out).all())
            rel = float((out.double() - expected).norm() / expected.norm())
            errors.append(
                {
                    "shape": [m_per_rank, n, k],
                    "call": call,
                    "calls": ctx.calls,
                    "written": written,
                    "rel_error": rel,
                }
            )
    # no group given: the default one, named (symmetric memory rendezvous by its name)
    named = ctx.group is dist.group.WORLD and bool(ctx.group.group_name)
    return {"rank": rank, "results": errors, "default_group_named": named}


def algorithms(world: int, rank: int) -> dict[str, object]:
    """Every algorithm, calls of different algorithms back to back (they share the two
    slots), shapes odd and even, the shard passed in or written in place."""
    ctx = ag_gemm.create_context(None, max_m=world * 16, k=33, dtype=torch.float32, device="cpu")
    configs = [*ag_gemm.library_configs(ctx), replace(TILE, algorithm=ag_gemm.FUSED), TILE]
    results = []
    for call in range(3 * len(configs)):
        config = configs[call % len(configs)]
        m_per_rank, n = (5, 23) if call % 2 else (16, 40)
        a = _gathered(world, (m_per_rank, 33), 300 + call)
        b = torch.randn(33, n, generator=torch.Generator().manual_seed(call))
        if call % 3 == 2:  # the producer writes the shard where the call reads it
            shard = ag_gemm.input_buffer(ctx, m_per_rank)
            shard.copy_(a[rank * m_per_rank : (rank + 1) * m_per_rank])
        else:
            shard = a[rank * m_per_rank : (rank + 1) * m_per_rank].contiguous()
        out = torch.full((world * m_per_rank, n), float("nan"))
        ag_gemm.ag_gemm(shard, b, ctx, config, out=out)
        expected = a.double() @ b.double()
        results.append(
            {
                "algorithm": ag_gemm.algorithm_of(config),
                "written": bool(torch.isfinite(out).all()),
                "rel_error": float((out.double() - expected).norm() / expected.norm()),
            }
        )
    return {"rank": rank, "results": results}


def in_place(world: int, rank: int) -> dict[str, object]:
    """The producer writes straight into input_buffer; results match, calls after calls."""
    m_per_rank, n, k = 12, 20, 24
    ctx = ag_gemm.create_context(
        None, max_m=world * m_per_rank, k=k, dtype=torch.float32, device="cpu"
    )
    errors = []
    for call in range(4):
        a = _gathered(world, (m_per_rank, k), 500 + call)
        b = torch.randn(k, n, generator=torch.Generator().manual_seed(call))
        shard = ag_gemm.input_buffer(ctx, m_per_rank)
        shard.copy_(a[rank * m_per_rank : (rank + 1) * m_per_rank])  # the "producer"
        out = ag_gemm.ag_gemm(shard, b, ctx, TILE)
        expected = a.double() @ b.double()
        errors.append(float((out.double() - expected).norm() / expected.norm()))
    return {"rank": rank, "errors": errors}


def bad_inputs(world: int, rank: int) -> dict[str, object]:
    ctx = ag_gemm.create_context(None, max_m=world * 8, k=16, dtype=torch.float32, device="cpu")
    ok_a, ok_b = torch.randn(8, 16), torch.randn(16, 12)
    cases = {
        "dtype": (ok_a.double(), ok_b.double()),
        "mixed_dtype": (ok_a, ok_b.half()),
        "non_contiguous": (torch.randn(16, 8).t(), ok_b),
        "k_mismatch": (ok_a, torch.randn(15, 12)),
        "above_max": (torch.randn(9, 16), ok_b),
        "not_2d": (ok_a.reshape(2, 4, 16), ok_b),
    }
    messages = {}
    for name, (a, b) in cases.items():
        try:
            ag_gemm.ag_gemm(a, b, ctx, TILE)
            messages[name] = None
        except ValueError as e:
            messages[name] = str(e)
    try:
        ag_gemm.create_context(None, max_m=world * 8 + 1, k=16, dtype=torch.float32, device="cpu")
        messages["max_m_not_divisible"] = None if world > 1 else "n/a"
    except ValueError as e:
        messages["max_m_not_divisible"] = str(e)
    return {"rank": rank, "calls_after": ctx.calls, "messages": messages}


def reference_matches(world: int, rank: int) -> dict[str, object]:
    ctx = ag_gemm.create_context(None, max_m=world * 8, k=24, dtype=torch.float32, device="cpu")
    shard = torch.randn(8, 24, generator=torch.Generator().manual_seed(rank))
    b = torch.randn(24, 20, generator=torch.Generator().manual_seed(99))
    ours = ag_gemm.ag_gemm(shard, b, ctx, TILE)
    ref = ag_gemm.reference(shard, b)
    return {
        "rank": rank,
        "max_diff": float((ours - ref).abs().max()),
        "key": ag_gemm.key(shard, b, ctx),
        "fused": ag_gemm.torch_fused(shard, b, None),
    }


def tuned(world: int, rank: int) -> dict[str, object]:
    """The real task through the real tuner: both ranks in lockstep, one stored entry."""
    from pathlib import Path

    from registry import Store, cpu_fingerprint
    from registry.locks import backend_from_url
    from warmup.core.collectives import Lockstep
    from warmup.tuning.timing import wall_clock_timer
    from warmup.tuning.tuner import TuneOptions, Tuner

    root = Path(sys.argv[3]).parent / "registry"
    ctx = ag_gemm.create_context(None, max_m=world * 16, k=24, dtype=torch.float32, device="cpu")
    shard = torch.randn(16, 24, generator=torch.Generator().manual_seed(rank))
    b = torch.randn(24, 40, generator=torch.Generator().manual_seed(7))
    space = [
        KernelConfig.make({"BLOCK_M": bm, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2})
        for bm in (16, 32)
    ]
    task = ag_gemm.AgGemmTask(shard, b, ctx, configs=space)
    tuner = Tuner(
        Store(root, create=True),
        cpu_fingerprint(),
        timer=wall_clock_timer(),
        lockstep=Lockstep(dist.group.WORLD, timeout_s=60),
        lock_backend=backend_from_url(str(root.parent / "locks")),
        options=TuneOptions(parallel_compile=False),
    )
    outcome = tuner.get(task)
    errors = [m.error for m in outcome.search.measurements if not m.ok]
    return {
        "rank": rank,
        "winner": outcome.config.to_json(),
        "source": outcome.source,
        "errors": errors,
        "stored": len(Store(root)) if rank == 0 else None,
    }


def dropped_inputs(world: int, rank: int) -> dict[str, object]:
    """A task from the adapter drops its inputs and makes the same ones again, with
    their reference (a collective, on every rank together)."""
    shape = {"M": world * 8, "N": 24, "K": 16}
    (task,) = ag_gemm.ADAPTER.tasks([shape], dtype="fp32", group=None, device="cpu")
    shard, b, key = task.a.clone(), task.b.clone(), task.key()
    assert task._expected is not None
    expected = task._expected.clone()
    task.drop_inputs()
    dropped = [t is None or t.is_meta for t in (task.a, task.b, task.out, task._expected)]
    key_kept = task.key() == key
    task.remake_inputs()
    return {
        "rank": rank,
        "dropped": all(dropped),
        "key_kept": key_kept,
        "same": bool(torch.equal(task.a, shard) and torch.equal(task.b, b)),
        "same_reference": bool(torch.equal(task._expected, expected)),
        "check": task.verify(task.run(ag_gemm.BASELINE_CONFIG)),
    }


def fake_clock(world: int, rank: int, winner: str) -> dict[str, object]:
    """The real task and tuner over every algorithm, a fake clock on which ``winner`` is
    fastest: the tuner must store that algorithm's config, whatever it is."""
    from pathlib import Path

    from registry import Store, cpu_fingerprint
    from registry.locks import backend_from_url
    from warmup.core.collectives import Lockstep
    from warmup.tuning.tuner import TuneOptions, Tuner

    root = Path(sys.argv[3]).parent / "registry"
    ctx = ag_gemm.create_context(None, max_m=world * 16, k=24, dtype=torch.float32, device="cpu")
    shard = torch.randn(16, 24, generator=torch.Generator().manual_seed(rank))
    b = torch.randn(24, 40, generator=torch.Generator().manual_seed(7))
    fused = [replace(c, algorithm=ag_gemm.FUSED) for c in ag_gemm.space(ctx)[:2]]
    task = ag_gemm.AgGemmTask(shard, b, ctx, configs=ag_gemm.library_configs(ctx) + fused)
    ran: list[KernelConfig] = []

    def timer(fn, repetitions, meet=None):  # type: ignore[no-untyped-def]
        original, task.run = task.run, lambda config: ran.append(config) or original(config)
        try:
            fn()
        finally:
            task.run = original
        config = ran[-1]
        ms = 1.0 if ag_gemm.algorithm_of(config) == winner else 2.0 + len(config.kwargs) / 10
        return [ms] * repetitions

    tuner = Tuner(
        Store(root, create=True),
        cpu_fingerprint(),
        timer=timer,
        lockstep=Lockstep(dist.group.WORLD, timeout_s=60),
        lock_backend=backend_from_url(str(root.parent / "locks")),
        options=TuneOptions(parallel_compile=False),
    )
    outcome = tuner.get(task)
    stored = Store(root).entries()
    default = ag_gemm.AgGemmTask(shard, b, ctx).candidates()
    return {
        "rank": rank,
        "winner": outcome.config.to_json(),
        "stored": [e.best.to_json() for e in stored] if rank == 0 else None,
        "measured": sorted({ag_gemm.algorithm_of(m.config) for m in outcome.search.measurements}),
        "default_candidates": [ag_gemm.algorithm_of(c) for c in default],
    }


def _delayed(function: Any, rng: random.Random) -> Any:
    """``function`` after a random pause of up to 20 ms: ranks drift apart at every step."""

    def late(*args: Any, **kwargs: Any) -> Any:
        time.sleep(rng.random() * 0.02)
        return function(*args, **kwargs)

    return late


_LANDINGS: list[threading.Thread] = []  # joined before the rank exits (see protocol)


def _signal_before_data(ctx: Any, a_shard: torch.Tensor, at: Any) -> None:
    """A broken push: the flag first, the rows only once the reader has moved on (it
    armed its flags for its next call, or 2 s passed: the last call). The reader reads
    before the rows land however loaded the machine is; a fixed pause would let a slow
    reader find them landed."""
    for peer_rows, peer_flag in at.pushes:
        workspace.signal(ctx, peer_flag)
        landing = threading.Thread(target=_land_late, args=(peer_rows, peer_flag, a_shard))
        landing.start()
        _LANDINGS.append(landing)


def _land_late(rows: torch.Tensor, flag: torch.Tensor, shard: torch.Tensor) -> None:
    deadline = time.monotonic() + 2.0
    while int(flag.item()) != 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    rows.copy_(shard)


def protocol(world: int, rank: int, variant: str = "") -> dict[str, object]:
    """Calls of every algorithm back to back on one context, each rank pausing at random
    before every step of the protocol (a different pattern per rank), fresh data and a
    new M each call; ``variant`` 'signal_before_data' breaks the push to show the check
    can fail."""
    rng = random.Random(rank * 7919 + 1)
    for name in ("arm_and_meet", "push", "signal"):
        setattr(workspace, name, _delayed(getattr(workspace, name), rng))
    if variant == "signal_before_data":
        workspace.push = _signal_before_data
    ctx = ag_gemm.create_context(None, max_m=world * 16, k=20, dtype=torch.float32, device="cpu")
    configs = [*ag_gemm.library_configs(ctx), replace(TILE, algorithm=ag_gemm.FUSED)]
    errors = []
    for call in range(12):
        config = configs[call % len(configs)]
        m_per_rank, n = (3, 17) if call % 3 == 0 else (16, 24) if call % 3 == 1 else (9, 8)
        a = _gathered(world, (m_per_rank, 20), 700 + call)
        b = torch.randn(20, n, generator=torch.Generator().manual_seed(call))
        shard = a[rank * m_per_rank : (rank + 1) * m_per_rank].contiguous()
        out = ag_gemm.ag_gemm(shard, b, ctx, config)
        expected = a.double() @ b.double()
        error = float((out.double() - expected).norm() / expected.norm())
        errors.append({"algorithm": ag_gemm.algorithm_of(config), "rel_error": error})
    # A landing still in torch code when the interpreter finalises aborts the rank
    # ("terminate called without an active exception"): every one ends here, within 2 s.
    for landing in _LANDINGS:
        landing.join()
    return {"rank": rank, "results": errors}


def failed_launch(world: int, rank: int) -> dict[str, object]:
    """A fused config that cannot launch fails past the barrier, on every rank; the error
    reaches the caller and the next calls on the context are right."""
    ctx = ag_gemm.create_context(None, max_m=world * 8, k=16, dtype=torch.float32, device="cpu")
    broken = KernelConfig.make(
        {"BLOCK_M": 12, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}, algorithm=ag_gemm.FUSED
    )  # 12 rows: not a power of two
    a = _gathered(world, (8, 16), 900)
    b = torch.randn(16, 8, generator=torch.Generator().manual_seed(9))
    shard = a[rank * 8 : (rank + 1) * 8].contiguous()
    try:
        ag_gemm.ag_gemm(shard, b, ctx, broken)
        error = None
    except Exception as e:  # the interpreter's error, whatever its type
        error = type(e).__name__
    errors = []
    fused = replace(TILE, algorithm=ag_gemm.FUSED)
    for call, config in enumerate([fused, *ag_gemm.library_configs(ctx)]):
        a = _gathered(world, (8, 16), 901 + call)
        shard = a[rank * 8 : (rank + 1) * 8].contiguous()
        out = ag_gemm.ag_gemm(shard, b, ctx, config)
        expected = a.double() @ b.double()
        errors.append(float((out.double() - expected).norm() / expected.norm()))
    return {"rank": rank, "error": error, "errors": errors}


def shared(world: int, rank: int) -> dict[str, object]:
    """Three layers of one process on its workspace of the group: the first sized for
    the largest by a reservation, one made larger later (the workspace grows), their
    calls interleaved across every algorithm, a producer writing in place."""
    from kernels import startup  # a rank's own: what the workspace counted

    with startup.recording() as record:
        workspace.reserve_workspace(None, nbytes=world * 16 * 33 * 4, device="cpu")
        small, wide = (
            ag_gemm.create_context(
                None, max_m=world * m, k=k, dtype=torch.float32, device="cpu", shared=True
            )
            for m, k in ((16, 20), (16, 33))
        )
        before_growth = dict(record.counts)
        large = ag_gemm.create_context(
            None, max_m=world * 32, k=33, dtype=torch.float32, device="cpu", shared=True
        )
    configs = [*ag_gemm.library_configs(small), TILE]
    errors = []
    for call in range(4 * len(configs)):
        ctx = (small, wide, large)[call % 3]
        config = configs[call % len(configs)]
        m_per_rank, n = (5, 23) if call % 2 else (16, 40)
        a = _gathered(world, (m_per_rank, ctx.k), 700 + call)
        b = torch.randn(ctx.k, n, generator=torch.Generator().manual_seed(call))
        if call % 4 == 3:  # the producer writes the shard where the call reads it
            shard = ag_gemm.input_buffer(ctx, m_per_rank)
            shard.copy_(a[rank * m_per_rank : (rank + 1) * m_per_rank])
        else:
            shard = a[rank * m_per_rank : (rank + 1) * m_per_rank].contiguous()
        out = ag_gemm.ag_gemm(shard, b, ctx, config)
        expected = a.double() @ b.double()
        errors.append(float((out.double() - expected).norm() / expected.norm()))
    return {
        "rank": rank,
        "errors": errors,
        "before_growth": before_growth,
        "counts": record.counts,
        "one_space": small.space is wide.space and small.flags is wide.flags,
        "same_rows": small.buffer.data_ptr() == wide.buffer.data_ptr(),
        "grown": large.space is not small.space and large.space.nbytes >= world * 32 * 33 * 4,
    }


SCENARIOS: dict[str, Any] = {
    "failed_launch": failed_launch,
    "protocol": protocol,  # protocol[:signal_before_data]
    "correctness": correctness,
    "bad_inputs": bad_inputs,
    "in_place": in_place,
    "shared": shared,
    "algorithms": algorithms,
    "tuned": tuned,
    "reference": reference_matches,
    "fake_clock": fake_clock,  # fake_clock:ALGORITHM
    "dropped_inputs": dropped_inputs,
}


def run_ranks(world: int, scenario: str, tmp_path: Path, timeout: float = 600) -> list[dict]:
    """The test's side: ``world`` ranks of this module running ``scenario``; their results."""
    from tests.conftest import run_rank_processes  # the test process's own: no rank needs it

    init = tmp_path / f"init-{scenario}-{world}"
    return run_rank_processes(
        "tests.kernels._ag_gemm_ranks", world, str(init), scenario, timeout=timeout
    )


def main() -> None:
    world, rank, init_file, scenario = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    name, _, argument = scenario.partition(":")
    try:
        run = SCENARIOS[name]
        result = run(world, rank, argument) if argument else run(world, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
