"""What a tuner is told and what it answers: its options, its counters, a shape's outcome.

Every piece of the tuner (:mod:`warmup.tuning.lookup`, :mod:`warmup.tuning.fleet_lock`,
:mod:`warmup.tuning.fenced_put`, :mod:`warmup.tuning.tuner`) reads these, so they sit
below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from registry import Entry, KernelConfig, MatchPolicy
from warmup.tuning import compile_pool
from warmup.tuning.search import HalvingPlan, SearchResult

Policy = Literal["tune", "fallback", "fail"]
Found = Literal["registry", "remote"]  # the local store (the volume), or the remote tier


@dataclass(frozen=True)
class TuneOptions:
    policy: Policy = "tune"
    match: MatchPolicy = MatchPolicy.EXACT
    plan: HalvingPlan = field(default_factory=HalvingPlan)
    lock_ttl_s: float = 60.0
    lock_timeout_s: float = 1800.0
    lock_outage_s: float = 30.0  # a lock server silent this long: tune without the lock
    rank_timeout_s: float = 300.0
    parallel_compile: bool = True
    compile_workers: int | None = None
    cache_dir: Path | None = None  # TRITON_CACHE_DIR, to prove launches hit it

    def store_wait(self, store_lock_timeout: float) -> float:
        """How long the other ranks wait for rank 0's registry read or write: a quarantine
        or a put may wait for the store's write lock (``store_lock_timeout``) first."""
        return store_lock_timeout + self.rank_timeout_s

    def lock_wait(self) -> float:
        """How long the other ranks wait for rank 0 to take the fleet lock and look again."""
        return self.lock_timeout_s + self.rank_timeout_s


@dataclass
class TunerStats:
    """Counters the metrics exporter reads."""

    hits: int = 0
    misses: int = 0
    tuned: int = 0
    fallbacks: int = 0
    tuning_seconds: float = 0.0
    lock_wait_seconds: float = 0.0
    unlocked: int = 0  # shapes tuned without the fleet lock: its server did not answer
    superseded: int = 0  # tunings not stored: another holder stored the shape first
    lock_lost: int = 0  # searches stopped because their fleet lock was lost


@dataclass(frozen=True)
class Deferred:
    """A miss whose fleet lock another pod holds (``Tuner.try_get``): come back later."""

    reason: str  # who holds the lock, or why it could not be taken


@dataclass
class TuneOutcome:
    config: KernelConfig
    source: Literal["registry", "remote", "tuned", "fallback"]  # remote: the remote tier
    entry: Entry | None = None
    seconds: float = 0.0
    benchmark_runs: int = 0  # timed repetitions; 0 on a hit
    lock_wait_s: float = 0.0
    search: SearchResult | None = None
    pool: compile_pool.PoolReport | None = None
    cache_files_added_while_timing: int | None = None
    notes: list[str] = field(default_factory=list)
    unlocked: bool = False  # tuned without the fleet lock (its server did not answer)
    superseded: bool = False  # tuned, but another holder's entry landed first: it is used

    @classmethod
    def hit(
        cls, found: tuple[Entry, Found], seconds: float, *, lock_wait_s: float = 0.0
    ) -> TuneOutcome:
        """A stored entry used as it is (``found``: the entry and the tier that had it)."""
        entry, source = found
        return cls(entry.best, source, entry, seconds, lock_wait_s=lock_wait_s)
