"""Rank 0 stores a tuning with its fence; every rank ends with the entry that landed.

The fence (``Store.fence``) makes the lock's promise hold when the lock does not: a
holder that lost its lock while it tuned (a redis restart, a pause past the ttl), or
tuned without one (the lock server silent), stores only if nobody stored the shape
since it looked. Otherwise its put is refused (``Superseded``) and it takes the stored
entry: one tuning per shape lands, and every pod ends with it. Pods that share only
redis fence its field too: a refused publish (this pod's volume took the tuning) hands
back the published entry, which this pod takes and files in its volume.

A holder that learns it lost its lock (the heartbeat found the key gone or another's,
or ``Holder.confirm`` just before the put does) stops before its write: it waits for
the lock as any waiter does, then puts with its fence, so an entry that the lock's new
holder stored meanwhile is taken instead of this tuning; only a lock it cannot take
again leaves the shape unstored (this run uses its own tuning).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernels.task import TuneTask
from registry import Entry, LockTimeout, RegistryError
from registry.core.errors import Superseded
from registry.core.fingerprint import Fingerprint
from registry.locks import Holder, LockServerUnreachable
from registry.remote.tiered import TieredFence, TieredStore
from warmup.core.collectives import Lockstep, Stored
from warmup.tuning.fleet_lock import FleetLock, lock_name
from warmup.tuning.leader import on_leader
from warmup.tuning.lookup import RegistryLookup
from warmup.tuning.outcome import TuneOptions, TuneOutcome, TunerStats

log = logging.getLogger(__name__)
FENCED_TRIES = 3  # puts refused in a row before a shape fails: each means another landed


@dataclass(frozen=True)
class _Put:
    """Rank 0's tuned ``entry`` of ``task`` at ``key``, to store under ``fence``."""

    task: TuneTask
    key: Mapping[str, Any]
    fingerprint: Fingerprint
    entry: Entry
    fence: TieredFence


@dataclass
class FencedPut:
    """Stores a tuned outcome under its fence, relocking first when the lock was lost."""

    store: TieredStore
    lockstep: Lockstep
    options: TuneOptions
    stats: TunerStats
    lookup: RegistryLookup
    fleet_lock: FleetLock

    def store_outcome(
        self,
        task: TuneTask,
        fingerprint: Fingerprint,
        key: Mapping[str, Any],
        outcome: TuneOutcome,
        started: float,
        fence: TieredFence,
        holder: Holder | None = None,
    ) -> None:
        """Rank 0 stores the tuning with its fence; every rank's ``outcome`` gets the
        stored entry: this tuning's, or, when another holder stored the shape first,
        that one (its config included). A ``holder`` that lost the lock takes it again
        before it stores (module docstring)."""
        assert outcome.search is not None
        search = outcome.search

        def put() -> Stored:  # one writer: rank 0
            entry = Entry.make(
                task.kernel,
                key,
                fingerprint,
                outcome.config,
                measurements=tuple(search.measurements),
                tuning_seconds=time.perf_counter() - started,
                source="tuned",
            )
            lost = holder.confirm() if holder is not None else None
            pending = _Put(task, key, fingerprint, entry, fence)
            if holder is not None and lost is not None:
                return self._put_relocked(pending, lost)
            return self._put_fenced(pending)

        stored = on_leader(
            self.lockstep,
            put,
            Stored,
            what="stored entry",
            failed=f"{task.kernel} at {dict(key)}: tuned, not stored",
            timeout_s=self.options.store_wait(self.store.lock_timeout),
        )
        outcome.entry = stored.entry
        if stored.unstored is not None:
            outcome.notes.append(f"not stored: {stored.unstored}")
        if stored.superseded:
            self.stats.superseded += 1
            outcome.superseded, outcome.config = True, outcome.entry.best
            outcome.notes.append("another holder stored this shape first: its entry is used")

    def _put_relocked(self, pending: _Put, lost: str) -> Stored:
        """Rank 0 lost the lock while it tuned: no write until it holds the lock again
        (the new holder finishes first), then the fenced put takes what landed."""
        task, key = pending.task, pending.key
        name = lock_name(task.kernel, key)
        log.warning(
            "%s at %s: lock %s lost while tuning (%s): not storing until it is held again",
            task.kernel,
            dict(key),
            name,
            lost,
        )
        wait = min(self.options.lock_timeout_s, self.options.rank_timeout_s / 2)
        try:
            with self.fleet_lock.shape_lock(task.kernel, key, wait):
                return self._put_fenced(pending)
        except (LockTimeout, LockServerUnreachable) as e:
            log.warning("%s at %s: tuned, not stored: %s", task.kernel, dict(key), e)
            unstored = f"lock {name} lost ({lost}), not taken again"
            return Stored(entry=pending.entry, unstored=unstored)

    def _put_fenced(self, pending: _Put) -> Stored:
        """Rank 0's put with its fence; refused, the entry another holder stored is taken,
        or, if the lookup does not take it (not among the candidates), the put is tried
        again with a new fence."""
        task, key, fence = pending.task, pending.key, pending.fence
        for _ in range(FENCED_TRIES):
            try:
                return Stored(entry=self.store.put(pending.entry, fence=fence))
            except Superseded as e:
                log.warning(
                    "%s at %s: another holder stored this shape while this one tuned "
                    "(its lock lost or never taken); this tuning is not %s",
                    task.kernel,
                    dict(key),
                    "published" if e.held is not None else "stored",
                )
                if e.held is not None and task.accepts(e.held.best):  # the fleet's entry
                    return Stored(entry=e.held, superseded=True)
            fence = self.store.fence(task.kernel, key, pending.fingerprint)
            found = self.lookup.look(task, key, pending.fingerprint, remote_now=True)
            if found is not None:
                return Stored(entry=found.entry, superseded=True)
        raise RegistryError(
            f"{task.kernel} at {dict(key)}: {FENCED_TRIES} puts refused in a row, each "
            "because another holder stored the shape, and its entry is not usable here."
        )
