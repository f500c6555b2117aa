"""The tuner's reads of the registry: rank 0 looks, every rank follows its answer.

A lookup before the lock decides hit or miss; a lookup under the lock first fences the
entry (``Store.fence``: whatever lands after it, this holder's put will not overwrite);
a miss under policy "fallback" takes the nearest stored shape's config instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernels.task import TuneTask
from registry import Entry
from registry.core.fingerprint import Fingerprint
from registry.remote.tiered import TieredFence, TieredStore
from warmup.core.collectives import Chosen, Located, Lockstep, Lookup
from warmup.tuning.leader import on_leader
from warmup.tuning.outcome import Found, TuneOptions, TuneOutcome, TunerStats

log = logging.getLogger(__name__)


@dataclass
class RegistryLookup:
    """Rank 0's lookups of a task's entry, shared with every rank."""

    store: TieredStore
    lockstep: Lockstep
    options: TuneOptions
    stats: TunerStats

    def agreed(
        self, task: TuneTask, key: Mapping[str, Any], fingerprint: Fingerprint
    ) -> tuple[Entry, Found] | None:
        """Rank 0 looks (the local tier, then the remote one); every rank follows its
        answer (never mismatched collectives)."""
        answer = on_leader(
            self.lockstep,
            lambda: Lookup(found=self.look(task, key, fingerprint, remote_now=False)),
            Lookup,
            what="registry lookup",
            failed=f"{task.kernel} at {dict(key)}: registry lookup failed",
            timeout_s=self.options.store_wait(self.store.lock_timeout),
        )
        return _found(answer.found)

    def fenced(
        self, task: TuneTask, key: Mapping[str, Any], fingerprint: Fingerprint
    ) -> tuple[tuple[Entry, Found] | None, TieredFence]:
        """The lookup under the lock, after rank 0 fenced the entry (module docstring):
        whatever is stored after the fence, this holder's put will not overwrite."""

        def look() -> Lookup:
            fence = self.store.fence(task.kernel, key, fingerprint)
            # remote_now: a pod elsewhere may have stored it during a blip
            return Lookup(found=self.look(task, key, fingerprint, remote_now=True), fence=fence)

        answer = on_leader(
            self.lockstep,
            look,
            Lookup,
            what="lookup under lock",
            failed=f"{task.kernel} at {dict(key)}: registry lookup failed",
            timeout_s=self.options.lock_wait(),
        )
        assert answer.fence is not None
        return _found(answer.found), answer.fence

    def look(
        self, task: TuneTask, key: Mapping[str, Any], fingerprint: Fingerprint, *, remote_now: bool
    ) -> Located | None:
        """Rank 0's lookup: the entry, and whether it came from the remote tier; None
        when nothing is stored or the stored config is not among the candidates."""
        located = self.store.locate(
            task.kernel,
            key,
            fingerprint,
            self.options.match,
            remote_now=remote_now,
            keep=lambda entry: task.accepts(entry.best),  # else our own fenced put is refused
        )
        if located is None:
            return None
        entry, tier = located
        if not task.accepts(entry.best):
            log.warning(
                "%s %s: the stored config %s is not among the candidates any more; tuning again",
                task.kernel,
                dict(key),
                entry.best.label(),
            )
            return None
        return Located(entry=entry, remote=tier == "remote")

    def fallback(self, task: TuneTask, fingerprint: Fingerprint, started: float) -> TuneOutcome:
        """A miss under policy 'fallback': the nearest stored entry's config, else the
        space's first; counted as a miss and a fallback."""
        self.stats.misses += 1
        self.stats.fallbacks += 1
        mine = None
        if self.lockstep.leader:
            near = self.store.nearest(task.kernel, task.key(), fingerprint, self.options.match)
            mine = Chosen(
                config=near.best if near is not None else task.candidates()[0],
                source=str(near.key) if near is not None else "the space's default",
            )
        agreed = self.lockstep.share(mine, Chosen, what="fallback config")
        log.warning(
            "%s %s: no tuned config, falling back to %s (from %s)",
            task.kernel,
            task.key(),
            agreed.config.label(),
            agreed.source,
        )
        return TuneOutcome(
            agreed.config,
            "fallback",
            seconds=time.perf_counter() - started,
            notes=[f"fallback from {agreed.source}"],
        )


def _found(answer: Located | None) -> tuple[Entry, Found] | None:
    """A lookup's shared answer (:meth:`RegistryLookup.look`) as the entry and its tier."""
    if answer is None:
        return None
    return answer.entry, "remote" if answer.remote else "registry"
