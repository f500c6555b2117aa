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

The timer is injected (``warmup.tuning.timing``), so tests run the search with a fake.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kernels.task import TuneTask, check_contract
from registry import (
    Entry,
    KernelConfig,
    LockTimeout,
    MatchPolicy,
    RegistryError,
    Store,
    lock,
)
from registry.core.errors import Superseded, named
from registry.core.fingerprint import Fingerprint
from registry.locks import Holder, LockBackend, LockServerUnreachable, silent_for
from registry.remote.tiered import TieredFence, TieredStore
from warmup.core.collectives import (
    Answer,
    Chosen,
    Located,
    LockDecision,
    Lockstep,
    Lookup,
    P,
    Stored,
)
from warmup.tuning import compile_pool
from warmup.tuning.cpus import usable_cpus
from warmup.tuning.measure import TuneError as TuneError  # raised here too; callers import it
from warmup.tuning.measure import search_candidates
from warmup.tuning.search import HalvingPlan, SearchResult
from warmup.tuning.timing import Timer

log = logging.getLogger(__name__)
Policy = Literal["tune", "fallback", "fail"]
Found = Literal["registry", "remote"]  # the local store (the volume), or the remote tier
FENCED_TRIES = 3  # puts refused in a row before a shape fails: each means another landed


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


@dataclass(frozen=True)
class Taken:
    """The fleet lock, taken after ``waited`` seconds; or not, when its server did not
    answer (``unreachable`` says how): the shape is tuned all the same."""

    waited: float
    unreachable: str | None = None  # None: locked
    holder: Holder | None = None  # rank 0's, while it holds the lock


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


@dataclass(frozen=True)
class _Put:
    """Rank 0's tuned ``entry`` of ``task`` at ``key``, to store under ``fence``."""

    task: TuneTask
    key: Mapping[str, Any]
    fingerprint: Fingerprint
    entry: Entry
    fence: TieredFence


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
        options: TuneOptions = TuneOptions(),
        stats: TunerStats | None = None,
    ) -> None:
        self.store = store if isinstance(store, TieredStore) else TieredStore(store)
        self.fingerprint = fingerprint
        self.timer = timer
        self.latency_timer = latency_timer  # None: no latency guard (see _latency_guard)
        self.lockstep = lockstep or Lockstep()
        self.lock_backend = lock_backend
        self.options = options or TuneOptions()
        self.stats = stats or TunerStats()

    # ---- the registry flow ---------------------------------------------------------

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
        found = self._agreed_lookup(task, key, fingerprint)
        if found is not None:
            self.stats.hits += 1
            entry, source = found
            return TuneOutcome(entry.best, source, entry, time.perf_counter() - started)
        if self.options.policy == "fallback":
            return self._fallback(task, fingerprint, started)
        if self.options.policy == "fail":
            self.stats.misses += 1
            raise TuneError(
                f"No tuned config for {task.kernel} at {key} on "
                f"{fingerprint.gpu_slug()} and the policy is 'fail'."
            )
        with contextlib.ExitStack() as held:
            taken = self._lock(held, task.kernel, key, give_up_at)
            if isinstance(taken, Deferred):
                return taken
            again, fence = self._fenced_lookup(task, key, fingerprint)
            if again is not None:  # tuned by another pod while we waited
                self.stats.hits += 1
                entry, source = again
                seconds = time.perf_counter() - started
                return TuneOutcome(entry.best, source, entry, seconds, lock_wait_s=taken.waited)
            self.stats.misses += 1
            if taken.unreachable is not None:
                self._tuning_unlocked(task, key, taken.unreachable)
            task.remake_inputs()  # a shape put aside (warmup.tuning.sharing), tuned at last
            outcome = self.tune(task)
            outcome.lock_wait_s, outcome.unlocked = taken.waited, taken.unreachable is not None
            self._store(task, fingerprint, key, outcome, started, fence, taken.holder)
        outcome.seconds = time.perf_counter() - started
        self.stats.tuned += 1
        self.stats.tuning_seconds += outcome.seconds
        return outcome

    def _agreed_lookup(
        self,
        task: TuneTask,
        key: Mapping[str, Any],
        fingerprint: Fingerprint,
    ) -> tuple[Entry, Found] | None:
        """Rank 0 looks (the local tier, then the remote one); every rank follows its
        answer (never mismatched collectives)."""
        answer = self._on_leader(
            lambda: Lookup(found=self._look(task, key, fingerprint, remote_now=False)),
            Lookup,
            what="registry lookup",
            failed=f"{task.kernel} at {dict(key)}: registry lookup failed",
            timeout_s=self._store_wait(),
        )
        return _found(answer.found)

    def _fenced_lookup(
        self, task: TuneTask, key: Mapping[str, Any], fingerprint: Fingerprint
    ) -> tuple[tuple[Entry, Found] | None, TieredFence]:
        """The lookup under the lock, after rank 0 fenced the entry (module docstring):
        whatever is stored after the fence, this holder's put will not overwrite."""

        def look() -> Lookup:
            fence = self.store.fence(task.kernel, key, fingerprint)
            # remote_now: a pod elsewhere may have stored it during a blip
            return Lookup(found=self._look(task, key, fingerprint, remote_now=True), fence=fence)

        answer = self._on_leader(
            look,
            Lookup,
            what="lookup under lock",
            failed=f"{task.kernel} at {dict(key)}: registry lookup failed",
            timeout_s=self.options.lock_timeout_s + self.options.rank_timeout_s,
        )
        assert answer.fence is not None
        return _found(answer.found), answer.fence

    def _look(
        self, task: TuneTask, key: Mapping[str, Any], fingerprint: Fingerprint, *, remote_now: bool
    ) -> Located | None:
        """Rank 0's lookup: the entry, and whether it came from the remote tier."""
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

    def _on_leader(
        self, work: Callable[[], P], kind: type[P], *, what: str, failed: str, timeout_s: float
    ) -> P:
        """Rank 0 runs ``work`` and every rank gets its result, or every rank raises the
        same :class:`TuneError` when it failed: one shape fails on all ranks alike and the
        next collective still matches."""
        mine, result = None, None
        if self.lockstep.leader:
            try:
                result = work()
                sent = result.model_dump(mode="json") if self.lockstep.active else None
                mine = Answer(value=sent)  # one process: rank 0 keeps ``result``, sends none
            except Exception as e:  # a store that cannot be read, a lock server gone, ...
                mine = Answer(error=f"{failed}: {_named(e)}")
        agreed = self.lockstep.share(mine, Answer, what=what, timeout_s=timeout_s)
        if agreed.error is not None:
            raise TuneError(agreed.error)
        return result if result is not None else kind.model_validate(agreed.value)

    def _store_wait(self) -> float:
        """How long the other ranks wait for rank 0's registry read or write: a quarantine
        or a put may wait for the store's write lock first."""
        return self.store.lock_timeout + self.options.rank_timeout_s

    def _lock(
        self,
        held: contextlib.ExitStack,
        kernel: str,
        key: Mapping[str, Any],
        give_up_at: float | None,
    ) -> Taken | Deferred:
        """Rank 0 takes the fleet lock (:class:`Taken`), or :class:`Deferred` when another
        pod holds it and ``give_up_at`` is still ahead (then nothing is waited for). A
        lock server that has not answered for ``lock_outage_s`` does not stop the warmup:
        the shape is tuned without the lock (``Taken.unreachable``; another pod may
        tune it too; the fence lets the first to store it land). A lock held by
        another past the timeout fails this shape on every rank alike, so the next
        collective still matches."""
        started = time.perf_counter()
        got: list[Holder] = []  # rank 0's holder, for the check before its put
        decided = self._on_leader(
            functools.partial(self._take_lock, held, kernel, key, give_up_at, got),
            LockDecision,
            what="lock outcome",
            failed=f"{kernel} at {dict(key)}",
            timeout_s=self.options.lock_timeout_s + self.options.rank_timeout_s,
        )
        if decided.deferred is not None:
            return Deferred(decided.deferred)
        waited = time.perf_counter() - started
        self.stats.lock_wait_seconds += waited
        return Taken(waited, unreachable=decided.unlocked, holder=got[0] if got else None)

    def _take_lock(
        self,
        held: contextlib.ExitStack,
        kernel: str,
        key: Mapping[str, Any],
        give_up_at: float | None,
        got: list[Holder],
    ) -> LockDecision:
        """Rank 0's side of :meth:`_lock`: the lock entered into ``held`` (its holder
        into ``got``), or why not."""
        waits = give_up_at is None

        def given_up() -> bool:  # asked when the lock was not taken, not before
            return give_up_at is not None and time.monotonic() >= give_up_at

        options = self.options
        try:
            taken = self._shape_lock(kernel, key, options.lock_timeout_s if waits else 0.0)
            got.append(held.enter_context(taken))
        except LockServerUnreachable as e:
            silent = silent_for(self.lock_backend)
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

    def _tuning_unlocked(self, task: TuneTask, key: Mapping[str, Any], why: str) -> None:
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

    def _store(
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

        stored = self._on_leader(
            put,
            Stored,
            what="stored entry",
            failed=f"{task.kernel} at {dict(key)}: tuned, not stored",
            timeout_s=self._store_wait(),
        )
        outcome.entry = stored.entry
        if stored.unstored is not None:
            outcome.notes.append(f"not stored: {stored.unstored}")
        if stored.superseded:
            self.stats.superseded += 1
            outcome.superseded, outcome.config = True, outcome.entry.best
            outcome.notes.append("another holder stored this shape first: its entry is used")

    def _shape_lock(
        self, kernel: str, key: Mapping[str, Any], timeout: float
    ) -> contextlib.AbstractContextManager[Holder]:
        """The fleet lock of ``kernel`` at ``key``, waited for up to ``timeout``."""
        options = self.options
        return lock(
            lock_name(kernel, key),
            ttl=options.lock_ttl_s,
            timeout=timeout,
            backend=self.lock_backend,
            outage_s=options.lock_outage_s,
        )

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
            with self._shape_lock(task.kernel, key, wait):
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
            found = self._look(task, key, pending.fingerprint, remote_now=True)
            if found is not None:
                return Stored(entry=found.entry, superseded=True)
        raise RegistryError(
            f"{task.kernel} at {dict(key)}: {FENCED_TRIES} puts refused in a row, each "
            "because another holder stored the shape, and its entry is not usable here."
        )

    def _fallback(self, task: TuneTask, fingerprint: Fingerprint, started: float) -> TuneOutcome:
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

    # ---- the search ----------------------------------------------------------------

    def tune(self, task: TuneTask) -> TuneOutcome:
        """Search the task's candidates in lockstep (:mod:`warmup.tuning.measure`); no
        registry involved."""
        started = time.perf_counter()
        found = search_candidates(
            task,
            timer=self.timer,
            lockstep=self.lockstep,
            plan=self.options.plan,
            latency_timer=self.latency_timer,
            workers=self._compile_workers if self.options.parallel_compile else None,
            cache_dir=self.options.cache_dir,
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


def _found(answer: Located | None) -> tuple[Entry, Found] | None:
    """A lookup's shared answer (``Tuner._look``) as the entry and its tier."""
    if answer is None:
        return None
    return answer.entry, "remote" if answer.remote else "registry"


def _named(error: BaseException) -> str:
    """A registry error as its message (it names what failed), any other with its type."""
    return str(error) if isinstance(error, RegistryError) else named(error)


def lock_name(kernel: str, key: Mapping[str, Any]) -> str:
    """The fleet lock's name of ``kernel`` at ``key``: one per shape."""
    return f"tune/{kernel}/{json.dumps(key, sort_keys=True)}"
