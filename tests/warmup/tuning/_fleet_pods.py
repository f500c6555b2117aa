"""One rank of one pod in the fleet tests: pods that start together share the tuning.

Usage: python -m tests.warmup.tuning._fleet_pods SCENARIO PODS RANKS POD RANK WORKDIR [REDIS_URL]
Every pod has its own gloo group; all pods' processes leave one start gate together.
Tuning a shape takes a known time (the fake task sleeps at each launch). With a redis
URL the pods share only redis (locks and the registry's remote tier), each with its own
volume; without, they share one volume (its lease folder and registry).
Prints one JSON line.

The killed scenario is ordered by events, not pauses, so that load cannot reorder it:
pod 0 says it holds its first shape's lock (a file), the other pods start then, each
says when it put that shape aside, and pod 0 dies only once all of them have.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from registry import KernelConfig, Store, cpu_fingerprint
from registry.locks import backend_from_url
from registry.remote.tier import remote_tier
from registry.remote.tiered import TieredStore
from tests.warmup.tuning._tuner_ranks import start_together
from tests.warmup.tuning.fakes import FakeTask, fake_timer
from warmup.core.collectives import Lockstep
from warmup.tuning.sharing import Job, rotated, start_fraction, warm_shared
from warmup.tuning.tuner import TuneOptions, Tuner

SHAPES = [64 * (i + 1) for i in range(8)]  # M of each fake shape
TTL_S = 1.0


@dataclass
class HeldThenKilled(FakeTask):
    """Pod 0's shape: marks ``marks`` at its first launch (its lock is held then), and
    kills its process at the second, once every file of ``waits`` is there."""

    marks: list[Path] = field(default_factory=list)
    waits: list[Path] = field(default_factory=list)

    def run(self, config: KernelConfig) -> str:
        if self.launches == 0:
            for mark in self.marks:
                mark.touch()
        elif self.launches == 1:
            wait_for(self.waits)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run(config)


@dataclass
class PutAside(FakeTask):
    """The other pods' copy of that shape: marks ``marks`` when it is put aside."""

    marks: list[Path] = field(default_factory=list)
    waits: list[Path] = field(default_factory=list)

    def drop_inputs(self) -> None:
        super().drop_inputs()
        for mark in self.marks:
            mark.touch()


def wait_for(paths: list[Path], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() for path in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"never appeared: {[str(p) for p in paths if not p.exists()]}")
        time.sleep(0.01)


def main() -> None:
    scenario, pods, ranks, pod, rank = sys.argv[1], *map(int, sys.argv[2:6])
    work, redis_url = Path(sys.argv[6]), sys.argv[7] if len(sys.argv) > 7 else ""
    dist.init_process_group(
        "gloo", init_method=f"file://{work / f'pg-{pod}'}", rank=rank, world_size=ranks
    )
    start_together(work, pod * ranks + rank, pods * ranks, 0.0)
    lockstep = Lockstep(dist.group.WORLD, timeout_s=60)
    if redis_url:
        local = Store(work / f"volume-{pod}" / "registry", create=True)
        store = TieredStore(local, remote_tier(redis_url) if rank == 0 else None)
        locks = backend_from_url(redis_url)
    else:
        store = TieredStore(Store(work / "volume" / "registry", create=True))
        locks = backend_from_url(str(work / "volume" / "locks"))
    # killed: pod 0 takes the first shape and is killed mid-tuning, holding its lock, a
    # second after the other pods started on the same shape list and found that lock held
    killed = scenario == "killed"
    dies = killed and pod == 0
    fraction = start_fraction(lockstep)
    if killed:
        fraction = 0.0
        if not dies:
            wait_for([work / "held"])
    jobs = []
    for m in rotated(SHAPES, fraction):
        task: FakeTask = FakeTask({16: 1.0, 32: 0.5, 64: 0.7}, m=m, sleep_s=0.05)
        if killed and m == SHAPES[0]:
            others = [work / f"put-aside-{other}" for other in range(1, pods)]
            task = HeldThenKilled(task.timings, m=m) if dies else PutAside(task.timings, m=m)
            task.marks = [work / "held"] if dies else [work / f"put-aside-{pod}"]
            task.waits = others
        tuner = Tuner(
            store,
            cpu_fingerprint(),
            timer=fake_timer(task),
            lockstep=lockstep,
            lock_backend=locks,
            options=TuneOptions(rank_timeout_s=60, lock_timeout_s=60, lock_ttl_s=TTL_S),
        )
        jobs.append(Job(task, tuner))
    started = time.monotonic()
    results = []
    for settled in warm_shared(jobs, lock_timeout_s=60):
        outcome, task = settled.outcome, settled.job.task
        results.append(
            {
                "m": task.key()["M"],
                "source": outcome.source if outcome else "failed",
                "error": str(settled.error) if settled.error else None,
                "deferred_s": settled.deferred_s,
                "at": time.monotonic() - started,
            }
        )
    print(json.dumps({"pod": pod, "rank": rank, "shapes": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
