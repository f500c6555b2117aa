"""The fleet lock of one shape: rank 0 takes it, every rank learns the decision.

A lock another pod holds is waited for (``Tuner.get``) or not (``Tuner.try_get``:
:class:`~warmup.tuning.outcome.Deferred`); a lock server that has not answered for
``lock_outage_s`` does not stop the warmup: the shape is tuned without the lock, and
the fence (:mod:`warmup.tuning.fenced_put`) lets the first to store it land.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernels.task import TuneTask
from registry import LockTimeout, RegistryError, lock
from registry.locks import Holder, LockBackend, LockServerUnreachable, silent_for
from warmup.core.collectives import LockDecision, Lockstep
from warmup.tuning.leader import on_leader
from warmup.tuning.outcome import Deferred, TuneOptions, TunerStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Taken:
    """The fleet lock, taken after ``waited`` seconds; or not, when its server did not
    answer (``unreachable`` says how): the shape is tuned all the same."""

    waited: float
    unreachable: str | None = None  # None: locked
    holder: Holder | None = None  # rank 0's, while it holds the lock


@dataclass
class FleetLock:
    """Takes the fleet lock of a shape on rank 0 and shares the decision with every rank."""

    lockstep: Lockstep
    backend: LockBackend | None
    options: TuneOptions
    stats: TunerStats

    def take(
        self,
        held: contextlib.ExitStack,
        kernel: str,
        key: Mapping[str, Any],
        give_up_at: float | None,
    ) -> Taken | Deferred:
        """Rank 0 takes the lock into ``held`` (:class:`Taken`), or :class:`Deferred`
        when another pod holds it and ``give_up_at`` is still ahead (then nothing is
        waited for; ``give_up_at`` None waits). A lock held by another past the timeout
        fails this shape on every rank alike, so the next collective still matches."""
        started = time.perf_counter()
        got: list[Holder] = []  # rank 0's holder, for the check before its put
        decided = on_leader(
            self.lockstep,
            functools.partial(self._decide, held, kernel, key, give_up_at, got),
            LockDecision,
            what="lock outcome",
            failed=f"{kernel} at {dict(key)}",
            timeout_s=self.options.lock_wait(),
        )
        if decided.deferred is not None:
            return Deferred(decided.deferred)
        waited = time.perf_counter() - started
        self.stats.lock_wait_seconds += waited
        return Taken(waited, unreachable=decided.unlocked, holder=got[0] if got else None)

    def _decide(
        self,
        held: contextlib.ExitStack,
        kernel: str,
        key: Mapping[str, Any],
        give_up_at: float | None,
        got: list[Holder],
    ) -> LockDecision:
        """Rank 0's side of :meth:`take`: the lock entered into ``held`` (its holder
        into ``got``), or why not."""
        waits = give_up_at is None

        def given_up() -> bool:  # asked when the lock was not taken, not before
            return give_up_at is not None and time.monotonic() >= give_up_at

        options = self.options
        try:
            taken = self.shape_lock(kernel, key, options.lock_timeout_s if waits else 0.0)
            got.append(held.enter_context(taken))
        except LockServerUnreachable as e:
            silent = silent_for(self.backend)
            if waits or given_up() or silent >= options.lock_outage_s:
                return LockDecision(unlocked=f"{e} for {silent:.0f} s")
            return LockDecision(deferred=str(e))
        except LockTimeout as e:
            if waits:
                raise
            if given_up():
                waited = options.lock_timeout_s
                raise RegistryError(f"lock not taken in {waited:g} s of waiting: {e}") from e
            return LockDecision(deferred=str(e))
        return LockDecision()

    def shape_lock(
        self, kernel: str, key: Mapping[str, Any], timeout: float
    ) -> contextlib.AbstractContextManager[Holder]:
        """The fleet lock of ``kernel`` at ``key``, waited for up to ``timeout``."""
        options = self.options
        return lock(
            lock_name(kernel, key),
            ttl=options.lock_ttl_s,
            timeout=timeout,
            backend=self.backend,
            outage_s=options.lock_outage_s,
        )

    def tuning_unlocked(self, task: TuneTask, key: Mapping[str, Any], why: str) -> None:
        """Say that a shape is tuned without the fleet lock, and count it."""
        self.stats.unlocked += 1
        if self.lockstep.leader:
            log.warning(
                "%s at %s: tuning without the fleet lock (%s); another pod may tune it "
                "too: the first to store it wins, the other uses its entry",
                task.kernel,
                dict(key),
                why,
            )


def lock_name(kernel: str, key: Mapping[str, Any]) -> str:
    """The fleet lock's name of ``kernel`` at ``key``: one per shape."""
    return f"tune/{kernel}/{json.dumps(key, sort_keys=True)}"
