"""One process of the multi-process tuner tests.

Usage: python -m tests.warmup.tuning._tuner_ranks SCENARIO WORLD RANK WORKDIR START_AT
Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from registry import Entry, KernelConfig, Store, cpu_fingerprint
from registry.locks import backend_from_url
from tests.warmup.tuning.fakes import FakeTask, fake_timer
from warmup.core.collectives import Lockstep, RankFailure
from warmup.tuning.tuner import TuneOptions, Tuner


def make_tuner(task: FakeTask, store_root: Path, work: Path, lockstep: Lockstep) -> Tuner:
    return Tuner(
        Store(store_root, create=True),
        cpu_fingerprint(),
        timer=fake_timer(task),
        lockstep=lockstep,
        lock_backend=backend_from_url(str(work / "locks")),
        options=TuneOptions(rank_timeout_s=15, lock_timeout_s=60),
    )


def agreement(world: int, rank: int, work: Path) -> dict[str, object]:
    # Rank 1 finds BLOCK=16 slow: the max over ranks must rule 16 out everywhere.
    timings = {16: 3.0 if rank == 1 else 1.0, 32: 1.1, 64: 1.2}
    task = FakeTask(timings)
    tuner = make_tuner(task, work / "registry", work, Lockstep(dist.group.WORLD, timeout_s=15))
    outcome = tuner.get(task)
    return {
        "rank": rank,
        "source": outcome.source,
        "block": outcome.config.meta["BLOCK"],
        "stored": outcome.entry.best.meta["BLOCK"] if outcome.entry else None,
        "repetitions": sum(tuner.timer.calls),  # type: ignore[attr-defined]
        "meetings": tuner.timer.meetings,  # type: ignore[attr-defined]
        "alignments": tuner.timer.alignments,  # type: ignore[attr-defined]
    }


def disagree(world: int, rank: int, work: Path) -> dict[str, object]:
    # Ranks 1.. see a (stale, different) hit in their own store; rank 0 sees a miss.
    root = work / f"registry-{rank}"
    task = FakeTask({16: 1.0, 32: 0.5})
    if rank > 0:
        fingerprint = cpu_fingerprint().with_kernel(task.kernel_hash)
        Store(root, create=True).put(
            Entry.make(task.kernel, task.key(), fingerprint, KernelConfig.make({"BLOCK": 16}))
        )
    tuner = make_tuner(task, root, work, Lockstep(dist.group.WORLD, timeout_s=15))
    outcome = tuner.get(task)
    return {
        "rank": rank,
        "source": outcome.source,
        "block": outcome.config.meta["BLOCK"],
        "launches": task.launches,
    }


def killed(world: int, rank: int, work: Path) -> dict[str, object]:
    task = FakeTask({16: 1.0, 32: 0.5, 64: 0.7}, die_at_launch=3 if rank == 1 else None)
    tuner = make_tuner(task, work / "registry", work, Lockstep(dist.group.WORLD, timeout_s=10))
    started = time.monotonic()
    try:
        tuner.get(task)
        return {"rank": rank, "error": None}
    except RankFailure as e:
        return {
            "rank": rank,
            "error": str(e),
            "seconds": time.monotonic() - started,
            "stored": len(Store(work / "registry", create=True)),  # none if nothing landed
        }


def lock_server_gone(world: int, rank: int, work: Path) -> dict[str, object]:
    # Rank 0's lock server does not answer: after lock_outage_s every rank tunes the shape
    # without the lock, in lockstep, and the next shape (under a working lock) too.
    lockstep = Lockstep(dist.group.WORLD, timeout_s=15)
    task = FakeTask({16: 1.0, 32: 0.5}, m=32)
    gone = make_tuner(task, work / "registry", work, lockstep)
    gone.lock_backend = backend_from_url("redis://127.0.0.1:1/0")
    gone.options = TuneOptions(rank_timeout_s=15, lock_timeout_s=60, lock_outage_s=0.5)
    started = time.monotonic()
    outcome = gone.get(task)
    seconds = time.monotonic() - started
    task = FakeTask({16: 1.0, 32: 0.5}, m=64)
    after = make_tuner(task, work / "registry", work, lockstep).get(task)
    return {
        "rank": rank,
        "gone": outcome.source,
        "unlocked": outcome.unlocked,
        "seconds": seconds,
        "next": after.source,
    }


def same_key(world: int, rank: int, work: Path) -> dict[str, object]:
    # Independent processes (no process group) racing for one key on a shared volume.
    task = FakeTask({16: 1.0, 32: 0.5, 64: 0.7}, sleep_s=0.1)
    outcome = make_tuner(task, work / "registry", work, Lockstep()).get(task)
    return {
        "rank": rank,
        "source": outcome.source,
        "block": outcome.config.meta["BLOCK"],
        "lock_wait_s": outcome.lock_wait_s,
    }


def start_together(work: Path, rank: int, world: int, start_at: float) -> None:
    """Every process announces itself, then all leave the gate at once: a clock alone
    lets a process slowed by a loaded machine arrive after the others have finished."""
    (work / f"arrived-{rank}").touch()
    deadline = time.time() + 120
    while len(list(work.glob("arrived-*"))) < world or time.time() < start_at:
        if time.time() > deadline:
            raise TimeoutError(f"rank {rank}: the other processes never arrived")
        time.sleep(0.001)


def main() -> None:
    scenario, world, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    work, start_at = Path(sys.argv[4]), float(sys.argv[5])
    grouped = scenario != "same_key"
    if grouped:
        dist.init_process_group(
            "gloo", init_method=f"file://{work / 'pg-init'}", rank=rank, world_size=world
        )
    start_together(work, rank, world, start_at)
    result = globals()[scenario](world, rank, work)
    print(json.dumps(result), flush=True)
    if grouped and not result.get("error"):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
