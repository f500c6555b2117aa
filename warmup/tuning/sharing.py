"""Work sharing across a fleet: a pod never idles on a shape another pod is tuning.

Pods that start together on one registry take the missing shapes between them:

    first pass   every shape in this pod's order (the costliest first, so that no pod
                 ends on a long shape while the others wait; shapes of equal cost
                 in a rotation agreed by its ranks):
                 found -> warm it; missing and its lock free -> tune it;
                 missing and its lock held by another pod -> defer it
    second pass  the deferred shapes, round after round: each is found (stored by the
                 pod that held its lock), or its lock is free again (its holder died and
                 the lease expired: this pod tunes it), or its lock server has not
                 answered for ``lock_outage_s`` (this pod tunes it without the lock),
                 or it is deferred again;
                 a shape deferred longer than the lock timeout fails as a timeout would

A deferred shape's task drops its inputs while it waits (``drop_inputs``) and makes
them again once it is settled, to be warmed or tuned (``remake_inputs``; the tuner makes
them before it tunes): a pod that defers many shapes holds none of their inputs.

Pods that take shapes in the same order still spread: each skips the shapes the others
hold, so N pods that start together tune about 1/N of the work each.

Every decision comes from rank 0 through the tuner (``Tuner.try_get``), so all ranks of
a pod walk the same shapes in the same order and their collectives match. The pauses
between rounds are the same on every rank and end at the next collective.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from kernels.task import TuneTask
from warmup.core.collectives import Lockstep, Number
from warmup.tuning.tuner import (
    Deferred,
    TuneError,
    TuneOutcome,
    Tuner,
)

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
    cost: float = 0.0  # what tuning it costs, relative to the other jobs (its adapter's)
    deferred_at: float | None = None  # monotonic, when the first pass deferred it
    waited_s: float = 0.0  # second-pass seconds spent on it: its tries, the pauses


@dataclass
class Settled:
    """A job's answer: the outcome, or the error that failed the shape.

    ``seconds``: the try that settled it. ``deferred_s``: how long since the first pass
    deferred it, the pod's other work included: other shapes, user functions (0 when
    never deferred). ``idle_s``: the time this pod spent on nothing but shapes other
    pods held (tries that found them held, pauses between rounds) since the previous
    answer."""

    job: Job
    outcome: TuneOutcome | None
    error: TuneError | None = None
    seconds: float = 0.0
    deferred_s: float = 0.0
    idle_s: float = 0.0


def start_fraction(lockstep: Lockstep) -> float:
    """Where in its shape list this pod starts, as a fraction: rank 0 draws it, every
    rank gets the same. Pods that start together start at different shapes."""
    mine = Number(value=random.random()) if lockstep.leader else None
    return lockstep.share(mine, Number, what="start of the shape order").value


def rotated(items: list[T], fraction: float) -> list[T]:
    """``items`` starting at ``fraction`` of the way through, wrapping around."""
    if not items:
        return []
    start = min(int(fraction * len(items)), len(items) - 1)
    return items[start:] + items[:start]


def take_order(items: list[T], fraction: float, cost: Callable[[T], float]) -> list[T]:
    """The order a pod takes ``items`` in: the costliest first; equal costs from
    ``fraction`` of the way through their rotation (:func:`rotated`)."""
    return sorted(rotated(items, fraction), key=cost, reverse=True)  # sorted() is stable


def warm_shared(jobs: Iterable[Job], *, lock_timeout_s: float) -> Iterator[Settled]:
    """Settle every job, deferring those whose lock another pod holds (module docstring):
    :class:`Sharing`'s two passes, one after the other."""
    sharing = Sharing(lock_timeout_s=lock_timeout_s)
    yield from sharing.first_pass(jobs)
    yield from sharing.come_back()


class Sharing:
    """The two passes, for a caller with other work to do between them (the pod's user
    functions: other pods may finish the deferred shapes meanwhile).

    A deferred job fails once it has been waited on for ``lock_timeout_s`` in the second
    pass (the pod's own work in between does not count)."""

    def __init__(self, *, lock_timeout_s: float) -> None:
        self.lock_timeout_s = lock_timeout_s
        self.deferred: list[Job] = []
        self._idle = _Idle()

    def first_pass(self, jobs: Iterable[Job]) -> Iterator[Settled]:
        """Settle each job now, or defer it. ``jobs`` may be lazy: a job is made when
        the pass reaches it."""
        for job in jobs:
            started = time.monotonic()
            settled = _try(job, math.inf)
            if settled is None:
                job.task.drop_inputs()  # no memory held for a shape another pod tunes
                job.deferred_at = time.monotonic()
                self._idle.seconds += job.deferred_at - started
                self.deferred.append(job)
            else:
                yield self._idle.attach(settled)

    def come_back(self) -> Iterator[Settled]:
        """Settle every deferred job, round after round."""
        deferred, self.deferred = self.deferred, []
        yield from _come_back(deferred, self.lock_timeout_s, self._idle)


@dataclass
class _Idle:
    """Seconds spent on held shapes since the last answer."""

    seconds: float = 0.0

    def attach(self, settled: Settled) -> Settled:
        settled.idle_s, self.seconds = self.seconds, 0.0
        return settled


def _come_back(deferred: list[Job], lock_timeout_s: float, idle: _Idle) -> Iterator[Settled]:
    attempt = 0
    while deferred:
        still: list[Job] = []
        for job in deferred:
            assert job.deferred_at is not None
            started = time.monotonic()
            settled = _try(job, started + lock_timeout_s - job.waited_s)
            if settled is None:
                spent = time.monotonic() - started
                job.waited_s += spent
                idle.seconds += spent
                still.append(job)
            else:
                if settled.outcome is not None:  # every rank at once: a collective
                    job.task.remake_inputs()  # to be warmed with them
                settled.deferred_s = time.monotonic() - job.deferred_at
                yield idle.attach(settled)
        attempt = 0 if len(still) < len(deferred) else attempt + 1
        deferred = still
        if deferred and attempt:
            pause = min(POLL_CAP_S, POLL_FIRST_S * 2 ** (attempt - 1))
            time.sleep(pause)
            idle.seconds += pause
            for job in deferred:
                job.waited_s += pause


def _try(job: Job, give_up_at: float) -> Settled | None:
    started = time.monotonic()
    try:
        outcome = job.tuner.try_get(job.task, give_up_at=give_up_at)
    except TuneError as e:
        return Settled(job, None, e, seconds=time.monotonic() - started)
    if isinstance(outcome, Deferred):
        if job.deferred_at is None:
            log.info("%s: %s; warming other shapes first", _describe(job.task), outcome.reason)
        return None
    return Settled(job, outcome, seconds=time.monotonic() - started)


def _describe(task: Any) -> str:
    return f"{task.kernel} {task.key()}"
