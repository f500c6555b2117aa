"""The tuner: turns a cache miss into a stored, verified best config.

Flow for one (kernel, key), every rank in lockstep, rank 0 deciding:

    look up (rank 0's view wins) -- hit -------------------------------> use it
        | miss, policy "fallback": nearest tuned shape, else the space's default
        | miss, policy "fail": TuneError
        | miss, policy "tune": rank 0 takes the fleet lock, fences the entry, looks again
        |   (``try_get``: a lock another pod holds is not waited for -> Deferred)
        v
    compile every candidate in parallel (exact launch specialisation)
    successive halving: each candidate launched and checked, timed on every rank,
    its time the max over ranks; rank 0 broadcasts the winner
    the winner is checked again, rank 0 stores the entry with its fence, releases the lock

    A lock lost while the search runs stops it at the next measurement (every rank
    alike): the lock is released and taken again, and the new holder's entry is looked
    up (``try_get``: a lock held by the new holder defers the shape), so that the lost
    holder does not work on beside its successor.

Each step is a collaborator of its own: the lookups and the fallback
(:mod:`warmup.tuning.lookup`), the fleet lock (:mod:`warmup.tuning.fleet_lock`), the
fenced put and what a lost lock does to it (:mod:`warmup.tuning.fenced_put`), the
search with its latency guard (:mod:`warmup.tuning.measure`). The tuner is the flow.

The timer is injected (``warmup.tuning.timing``), so tests run the search with a fake.
"""

from __future__ import annotations

import contextlib
import math
import time

from kernels.task import TuneTask, check_contract
from registry import Store
from registry.core.fingerprint import Fingerprint
from registry.locks import Holder, LockBackend, LockLost
from registry.remote.tiered import TieredStore
from warmup.core.collectives import Lockstep
from warmup.tuning.cpus import usable_cpus
from warmup.tuning.fenced_put import FencedPut
from warmup.tuning.fleet_lock import FleetLock
from warmup.tuning.lookup import RegistryLookup
from warmup.tuning.measure import TuneError as TuneError  # raised here too; callers import it
from warmup.tuning.measure import search_candidates
from warmup.tuning.outcome import Deferred as Deferred  # the tuner's answers, public here
from warmup.tuning.outcome import TuneOptions as TuneOptions
from warmup.tuning.outcome import TuneOutcome as TuneOutcome
from warmup.tuning.outcome import TunerStats as TunerStats
from warmup.tuning.timing import Timer

STOPS_MAX = 2  # searches stopped by a lost lock before one goes on to its fenced put


class Tuner:
    """Looks up, or tunes and stores, the best config of a task; see the module docstring."""

    def __init__(
        self,
        store: Store | TieredStore,
        fingerprint: Fingerprint,
        *,
        timer: Timer,
        latency_timer: Timer | None = None,
        lockstep: Lockstep | None = None,
        lock_backend: LockBackend | None = None,
        options: TuneOptions | None = None,
        stats: TunerStats | None = None,
    ) -> None:
        self.store = store if isinstance(store, TieredStore) else TieredStore(store)
        self.fingerprint = fingerprint
        self.timer = timer
        self.latency_timer = latency_timer  # None: no latency guard (measure.latency_guard)
        self.lockstep = lockstep or Lockstep()
        self.lock_backend = lock_backend
        self.options = options or TuneOptions()
        self.stats = stats or TunerStats()

    def get(self, task: TuneTask) -> TuneOutcome:
        """The task's config: found, fallen back to, or tuned now; a lock another pod
        holds is waited for (up to ``lock_timeout_s``)."""
        outcome = self._get(task, None)
        assert isinstance(outcome, TuneOutcome)
        return outcome

    def try_get(self, task: TuneTask, *, give_up_at: float = math.inf) -> TuneOutcome | Deferred:
        """As :meth:`get`, except that a lock another pod holds (or a lock server that
        has not answered for ``lock_outage_s`` yet) is not waited for: :class:`Deferred`,
        to try again later. Once
        ``time.monotonic()`` passes ``give_up_at`` (rank 0's clock decides), a lock not
        taken fails the shape as :meth:`get`'s timeout would."""
        return self._get(task, give_up_at)

    def _get(self, task: TuneTask, give_up_at: float | None) -> TuneOutcome | Deferred:
        """``give_up_at`` None: wait for a held lock (``get``); else ``try_get``'s."""
        check_contract(task)  # every rank alike, before any collective
        started = time.perf_counter()
        fingerprint = self.fingerprint.with_kernel(task.kernel_hash)
        key = task.key()
        lookup, fleet_lock, put = self._steps()
        found = lookup.agreed(task, key, fingerprint)
        if found is not None:
            self.stats.hits += 1
            return TuneOutcome.hit(found, time.perf_counter() - started)
        if self.options.policy == "fallback":
            return lookup.fallback(task, fingerprint, started)
        if self.options.policy == "fail":
            self.stats.misses += 1
            raise TuneError(
                f"No tuned config for {task.kernel} at {key} on "
                f"{fingerprint.gpu_slug()} and the policy is 'fail'."
            )
        for stops in range(STOPS_MAX + 1):
            with contextlib.ExitStack() as held:
                taken = fleet_lock.take(held, task.kernel, key, give_up_at)
                if isinstance(taken, Deferred):
                    return taken
                again, fence = lookup.fenced(task, key, fingerprint)
                if again is not None:  # tuned by another pod while we waited
                    self.stats.hits += 1
                    seconds = time.perf_counter() - started
                    return TuneOutcome.hit(again, seconds, lock_wait_s=taken.waited)
                if stops == 0:  # a search stopped by a lost lock is the same miss
                    self.stats.misses += 1
                if taken.unreachable is not None:
                    fleet_lock.tuning_unlocked(task, key, taken.unreachable)
                task.remake_inputs()  # a shape put aside (warmup.tuning.sharing), tuned at last
                try:  # past STOPS_MAX losses the search goes on: the fence keeps the put safe
                    outcome = self.tune(task, holder=taken.holder if stops < STOPS_MAX else None)
                except LockLost:  # every rank alike: the lock is released, then taken again
                    self.stats.lock_lost += 1
                    continue
                outcome.lock_wait_s, outcome.unlocked = taken.waited, taken.unreachable is not None
                put.store_outcome(task, fingerprint, key, outcome, started, fence, taken.holder)
            break
        outcome.seconds = time.perf_counter() - started
        self.stats.tuned += 1
        self.stats.tuning_seconds += outcome.seconds
        return outcome

    def _steps(self) -> tuple[RegistryLookup, FleetLock, FencedPut]:
        """The flow's collaborators, made from the tuner's parts as they are at this call
        (a caller may set ``options`` or ``lock_backend`` between calls)."""
        parts = (self.lockstep, self.options, self.stats)
        lookup = RegistryLookup(self.store, *parts)
        fleet_lock = FleetLock(self.lockstep, self.lock_backend, self.options, self.stats)
        return lookup, fleet_lock, FencedPut(self.store, *parts, lookup, fleet_lock)

    def tune(self, task: TuneTask, *, holder: Holder | None = None) -> TuneOutcome:
        """Search the task's candidates in lockstep (:mod:`warmup.tuning.measure`); no
        registry involved. ``holder``: rank 0's fleet lock; the search stops
        (:class:`LockLost`) at its first measurement after the lock is lost."""
        started = time.perf_counter()
        found = search_candidates(
            task,
            timer=self.timer,
            lockstep=self.lockstep,
            plan=self.options.plan,
            latency_timer=self.latency_timer,
            workers=self._compile_workers if self.options.parallel_compile else None,
            cache_dir=self.options.cache_dir,
            holder=holder,
        )
        return TuneOutcome(
            found.best,
            "tuned",
            seconds=time.perf_counter() - started,
            benchmark_runs=found.search.repetitions,
            search=found.search,
            pool=found.pool,
            cache_files_added_while_timing=found.cache_files_added,
            notes=found.notes,
        )

    def _compile_workers(self) -> int:
        """The pool's size on this rank: as set, else the CPUs the pod may use, shared
        by its ranks (which all compile at once)."""
        if self.options.compile_workers:
            return self.options.compile_workers
        return max(1, usable_cpus() // self.lockstep.world)
