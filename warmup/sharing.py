"""Work sharing across a fleet: a pod never idles on a shape another pod is tuning.

Pods that start together on one registry take the missing shapes between them:

    first pass   every shape in this pod's order (a rotation agreed by its ranks):
                 found -> warm it; missing and its lock free -> tune it;
                 missing and its lock held by another pod -> defer it
    second pass  the deferred shapes, round after round: each is found (stored by the
                 pod that held its lock), or its lock is free again (its holder died and
                 the lease expired: this pod tunes it), or it is deferred again;
                 a shape deferred longer than the lock timeout fails as a timeout would

Every decision comes from rank 0 through the tuner (``Tuner.try_get``), so all ranks of
a pod walk the same shapes in the same order and their collectives match. The pauses
between rounds are the same on every rank and end at the next collective.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from warmup.lockstep import Lockstep
from warmup.tuner import Deferred, TuneError, TuneOutcome, Tuner, TuneTask

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_FIRST_S = 0.05  # the pause after a round that settled nothing; doubling up to a cap
POLL_CAP_S = 1.0


@dataclass
class Job:
    """One shape to warm and the tuner that answers for it (its entry's policy)."""

    task: TuneTask
    tuner: Tuner
    place: int = 0  # where its shape is in the manifest, for the report's order
    deferred_at: float | None = None  # monotonic, when the first pass deferred it


@dataclass
class Settled:
    """A job's answer: the outcome, or the error that failed the shape. ``deferred_s``
    is how long it waited for another pod (0 when it was never deferred), other work
    included; ``idle_s`` is the time the pod did nothing but wait for other pods since
    the previous answer."""

    job: Job
    outcome: TuneOutcome | None
    error: TuneError | None = None
    deferred_s: float = 0.0
    idle_s: float = 0.0


def start_fraction(lockstep: Lockstep) -> float:
    """Where in its shape list this pod starts, as a fraction: rank 0 draws it, every
    rank gets the same. Pods that start together start at different shapes."""
    mine = random.random() if lockstep.leader else None
    return float(lockstep.broadcast(mine, what="start of the shape order"))


def rotated(items: list[T], fraction: float) -> list[T]:
    """``items`` starting at ``fraction`` of the way through, wrapping around."""
    if not items:
        return []
    start = min(int(fraction * len(items)), len(items) - 1)
    return items[start:] + items[:start]


def warm_shared(jobs: Iterable[Job], *, lock_timeout_s: float) -> Iterator[Settled]:
    """Settle every job, deferring those whose lock another pod holds (module docstring).
    ``jobs`` may be lazy: a job is made when the first pass reaches it."""
    deferred: list[Job] = []
    for job in jobs:
        settled = _try(job, math.inf)
        if settled is None:
            job.deferred_at = time.monotonic()
            deferred.append(job)
        else:
            yield settled
    yield from _come_back(deferred, lock_timeout_s)


def _come_back(deferred: list[Job], lock_timeout_s: float) -> Iterator[Settled]:
    attempt, idle = 0, 0.0
    while deferred:
        still: list[Job] = []
        round_started = time.monotonic()
        for job in deferred:
            assert job.deferred_at is not None
            settled = _try(job, job.deferred_at + lock_timeout_s)
            if settled is None:
                still.append(job)
            else:
                settled.deferred_s = time.monotonic() - job.deferred_at
                settled.idle_s, idle = idle, 0.0
                yield settled
        attempt = 0 if len(still) < len(deferred) else attempt + 1
        deferred = still
        if deferred and attempt:
            time.sleep(min(POLL_CAP_S, POLL_FIRST_S * 2 ** (attempt - 1)))
            idle += time.monotonic() - round_started  # a round that settled nothing


def _try(job: Job, give_up_at: float) -> Settled | None:
    try:
        outcome = job.tuner.try_get(job.task, give_up_at=give_up_at)
    except TuneError as e:
        return Settled(job, None, e)
    if isinstance(outcome, Deferred):
        if job.deferred_at is None:
            log.info("%s: %s; warming other shapes first", _describe(job.task), outcome.reason)
        return None
    return Settled(job, outcome)


def _describe(task: Any) -> str:
    return f"{task.kernel} {task.key()}"
