"""The on-disk store of tuned configs.

Layout under the root (a person can read it)::

    current -> gen-000004                        one rename swaps generations
    gen-000004/GENERATION.json                   what made this generation, its parent
    gen-000004/.stamp                            replaced on every write: cheap change detection
    gen-000004/<kernel>/<gpu>/<software>/<shape>-<keyhash>.json
    quarantine/                                  corrupt files moved aside, never deleted
    .store.lock                                  serialises writers (fcntl)

A put writes one entry file atomically into the current generation. A bundle install
builds the next generation from hard links plus the bundle's entries, then swaps
``current``: readers see all of it or none of it, and the previous generation stays
for ``rollback``.

Fences: a tuner that may not be the only one tuning a shape (its lock lost to a redis
restart, a pause past the ttl, or no lock server at all) takes a :class:`Fence` before
it looks the shape up, and puts with it. The put lands only if the entry's file still
holds what the fence saw, checked under the write lock; otherwise it raises
:class:`Superseded` and writes nothing. Of all the holders that looked before any of
them stored, the first put lands; one that looks after it finds the entry. The check
needs nothing of the lock server, so it holds for redis, file leases and no lock alike.

Every writer's first write (put, install, rollback) first clears what killed writers
left (``.tmp-*`` files, unsealed generations, a broken ``current``): under the write
lock nobody else is writing, so all of it is debris. It spends at most
``recovery_budget_s`` per write and goes on at the next one; ``recovered`` counts it.

Each job is a collaborator with its own module:
:class:`~registry.storage.entry_reader.EntryReader` (loading, quarantining what is corrupt;
its :class:`~registry.storage.entry_reader.Loaded` view answers slots and layers),
:class:`~registry.storage.entry_writer.EntryWriter` (merging entries, fences),
:class:`~registry.storage.generation_writer.GenerationWriter` (install, rollback, repair;
old generations through :class:`~registry.storage.garbage.GarbageCollector`),
:class:`~registry.storage.recovery.Recovery` (killed writers' debris),
:class:`~registry.storage.write_lock.WriteLock` and
:class:`~registry.storage.quarantine.Quarantine`. :class:`Store` ties them together behind
one API.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from registry.core.config import KernelConfig
from registry.core.entry import Entry
from registry.core.errors import RegistryError
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.storage import keys
from registry.storage.entry_reader import MAX_ENTRY_BYTES, EntryReader, Loaded, read_entry
from registry.storage.entry_writer import EntryWriter, Fence, seen
from registry.storage.generation_writer import GenerationWriter
from registry.storage.generations import (
    CURRENT,
    Generation,
    Record,
    current,
    listed,
    read_record,
)
from registry.storage.keys import Key
from registry.storage.quarantine import QUARANTINE, Quarantine
from registry.storage.recovery import Recovery
from registry.storage.write_lock import WriteLock, check_root

EXACT = MatchPolicy.EXACT
KEEP_GENERATIONS = 8
RECOVERY_BUDGET_S = 2.0  # a write spends at most this clearing killed writers' debris

__all__ = [
    "CURRENT",
    "KEEP_GENERATIONS",
    "MAX_ENTRY_BYTES",
    "QUARANTINE",
    "RECOVERY_BUDGET_S",
    "Fence",
    "Store",
    "read_entry",
]


class Store:
    """Tuned configs on disk; lookups are dict accesses after a load.

    Readers call :meth:`lookup`, which reloads when another process changed the store
    (one ``readlink`` and one ``stat``, at most every ``check_interval`` seconds).

    ``root`` must be a folder (:class:`RegistryError` otherwise: a mistyped path must
    neither read as an empty store nor start a new one), unless ``create``: then its
    first write makes it, and until then it reads as empty.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = 120.0,
        check_interval: float = 0.0,
        keep_generations: int = KEEP_GENERATIONS,
        recovery_budget_s: float = RECOVERY_BUDGET_S,
        create: bool = False,
    ) -> None:
        self.root = Path(root)
        self.create = create
        if not create:
            check_root(self.root)
        self.lock_timeout = lock_timeout
        self.check_interval = check_interval
        self.keep_generations = max(2, keep_generations)
        self.recovery_budget_s = recovery_budget_s
        self._quarantine = Quarantine(self.root)
        self._lock = WriteLock(self.root, self._quarantine, timeout=lock_timeout, create=create)
        self._reader = EntryReader(self.root, self._lock, self._quarantine)
        self._writer = EntryWriter(self.root, self._quarantine)
        self._generations = GenerationWriter(
            self.root, self._writer, self._quarantine, keep=self.keep_generations
        )
        self._recovery = Recovery(
            self.root, self._lock, self._generations, budget_s=recovery_budget_s
        )
        self._loaded = Loaded()
        self._checked_at = -1.0

    @property
    def quarantined(self) -> int:
        """Files this store moved to quarantine because they held no entry."""
        return self._quarantine.moved

    @property
    def skipped(self) -> int:
        """Entries this store left alone because a newer version wrote them."""
        return self._reader.skipped

    @property
    def recovered(self) -> dict[str, int]:
        """What killed writers left that this store cleared, by kind: a metric."""
        return self._recovery.recovered

    # ---- reading -------------------------------------------------------------------

    def lookup(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy = EXACT
    ) -> Entry | None:
        """The entry for ``kernel`` at ``key`` valid for ``fingerprint``, or None (a miss)."""
        self.refresh()
        return keys.best_fit(self._loaded.slot(kernel, key), fingerprint, policy)

    def explain_miss(
        self, kernel: str, key: Mapping[str, Any], fingerprint: Fingerprint
    ) -> list[dict[str, tuple[object, object]]]:
        """For a miss: the fields in which each stored entry of this slot differs."""
        self.refresh()
        return [fingerprint.diff(e.fingerprint) for e in self._loaded.slot(kernel, key).values()]

    def nearest(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy = EXACT
    ) -> Entry | None:
        """The stored entry of ``kernel`` nearest to ``key``
        (:func:`registry.storage.keys.nearest`):
        the config a miss falls back to."""
        return keys.nearest(self.entries(), kernel, key, fingerprint, policy)

    def like(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy, *, free: str
    ) -> dict[Any, Entry]:
        """The entry :meth:`lookup` finds for each stored value of the ``free`` field, among
        the keys equal to ``key`` but for it: one layer's tuned Ms, by M. Read from one
        loaded generation."""
        self.refresh()
        return self._loaded.like(kernel, key, fingerprint, policy, free=free)

    def entries(self) -> list[Entry]:
        """Every loaded entry, in path order."""
        self.refresh()
        return self._loaded.entries()

    def __len__(self) -> int:
        self.refresh()
        return len(self._loaded.by_path)

    @property
    def version(self) -> tuple[object, ...]:
        """What the loaded entries were read from (generation, stamp): equal versions,
        equal entries. A reader that built something from them compares it later."""
        return self._loaded.version

    def refresh(self, *, force: bool = False) -> bool:
        """Reload if the store changed since the last load; True when it did."""
        now = time.monotonic()
        if not force and self._checked_at >= 0 and now - self._checked_at < self.check_interval:
            return False
        self._checked_at = now
        version = self._reader.version()
        if not force and version == self._loaded.version and version:
            return False
        self._loaded = self._reader.load(version, self._loaded)  # unchanged files not re-read
        return True

    def current_generation(self) -> Path | None:
        """The generation readers see: the one ``current`` links to or, while that link
        is missing or broken, the one a repair would restore (never an empty view)."""
        return current(self.root)

    def record(self, generation: Path | None = None) -> Record | None:
        """The record of ``generation`` (default: current); None when it is unsealed."""
        generation = generation or self.current_generation()
        return read_record(generation) if generation is not None else None

    def generations(self) -> list[Generation]:
        """Every sealed generation, oldest first, the current one marked."""
        return listed(self.root)

    def quarantined_files(self) -> int:
        """Files and folders in quarantine/, moved there by any process: what a metric shows."""
        return self._quarantine.count()

    # ---- writing -------------------------------------------------------------------

    def fence(self, kernel: str, key: Mapping[str, Any], fingerprint: Fingerprint) -> Fence:
        """What the entry file of ``kernel`` at ``key`` for ``fingerprint`` holds now, for
        a later :meth:`put` that must not land once another writer changed it. Take it
        before the lookup that decides to tune (module docstring). No lock: the file is
        replaced whole, so this reads the old bytes or the new."""
        stand_in = Entry.make(kernel, key, fingerprint, KernelConfig.make({}))
        relpath = stand_in.relpath().as_posix()
        gen = self.current_generation()
        if gen is None:
            return Fence(relpath, "")
        fence = Fence(relpath, seen(gen / relpath))
        self._catch_up(gen, relpath)
        return fence

    def _catch_up(self, gen: Path, relpath: str) -> None:
        """Reload unless the loaded entries hold ``relpath`` of ``gen`` as it is now, so
        that a lookup sees at least what a fence saw (a writer replaces the ``.stamp``,
        which tells readers to reload, only after the entry)."""
        if not self._loaded.holds(gen, relpath):
            self.refresh(force=True)

    def put(self, entry: Entry, *, fence: Fence | None = None) -> Entry:
        """Merge ``entry`` into the store atomically; returns what is stored for its slot.
        ``fence`` (:meth:`fence`): :class:`Superseded`, and nothing written, if the
        entry's file changed since the fence was taken."""
        return self._put([entry], fence)[0]

    def put_many(self, entries: Iterable[Entry]) -> list[Entry]:
        """Merge many entries under one lock; each file is replaced atomically."""
        return self._put(list(entries), None)

    def _put(self, entries: list[Entry], fence: Fence | None) -> list[Entry]:
        with self._writing():
            gen = self._generations.ensure()
            if fence is not None:
                self._writer.check_fence(gen, entries, fence)
            stored = [self._writer.merge_into(gen, e) for e in entries]
            self._generations.touch_stamp(gen)
        self.refresh(force=True)
        return stored

    def install(
        self,
        entries: Iterable[Entry],
        *,
        record: Mapping[str, Any],
        after_swap: Callable[[], None] | None = None,
        before_seal: Callable[[], Mapping[str, Any]] | None = None,
        admit: Callable[[], Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Make a new generation = current + ``entries`` and swap it in with one rename.

        ``record`` describes the change (a bundle's name and version); it lands in the
        generation's GENERATION.json together with the paths it changed, for rollback.
        ``after_swap`` runs right after the swap, still under the lock (a bundle moves its
        artifacts into the cache there); if it fails, the failure is logged and the swap
        stands. ``before_seal`` runs under the lock before the record is sealed; what it
        returns joins the record (a bundle notes what it will replace outside the store).
        ``admit`` runs first under the lock, before anything is written: it may refuse
        the install by raising (a bundle older than the one installed), or return what
        joins the record.
        """
        entries = list(entries)
        with self._writing():
            admitted = dict(admit()) if admit is not None else {}
            info = self._generations.install(
                entries,
                record={**record, **admitted},
                after_swap=after_swap,
                before_seal=before_seal,
            )
            self._collect_garbage()
        self.refresh(force=True)
        return info

    def rollback(self, *, after_swap: Callable[[Record], None] | None = None) -> dict[str, Any]:
        """Undo the latest bundle install not yet undone, keeping every other change.

        ``after_swap`` gets the undone install's record right after the swap, under the
        lock (a bundle puts back what it replaced outside the store there); if it fails,
        the failure is logged and the rollback stands."""
        if self.current_generation() is None:  # never create a store just to say so
            raise RegistryError(
                f"Store {self.root}: no bundle install left to roll back "
                "(it has no generation yet)."
            )
        with self._writing():
            info = self._generations.rollback(after_swap=after_swap)
            self._collect_garbage()
        self.refresh(force=True)
        return info

    def recover(self, *, budget_s: float = math.inf) -> dict[str, Any]:
        """Clean up after crashes: repair ``current`` and its record, remove ``.tmp-*``
        files left by killed writers and unsealed generations (a crashed install; one
        holding entries the current one lacks goes to quarantine instead). Every writer's
        first write does the same within a time budget (module docstring); ``budget_s``
        bounds this call likewise (checked per folder walked and per generation), the rest
        left to the next write (then the report has ``"unfinished": True``). Returns what
        it did; safe to call any time (it takes the write lock)."""
        report = self._recovery.recover(budget_s=budget_s)
        self.refresh(force=True)
        return report

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The write lock, and what killed writers left cleared first (within a budget)."""
        with self._lock.hold():
            if not self._recovery.cleared:
                self._recovery.clear_debris()
            yield

    def _collect_garbage(self) -> dict[str, list[str]]:
        """Drop generations nobody needs, after an install or a rollback under its lock:
        what it did (:meth:`GenerationWriter.collect_garbage`)."""
        return self._generations.collect_garbage()
