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
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import math
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock
from filelock import Timeout as FileLockTimeout

from registry import atomic, keys
from registry.config import KernelConfig
from registry.entry import Entry, NewerSchema, canonical_key, now_iso
from registry.errors import RegistryError, Superseded
from registry.fingerprint import Fingerprint, MatchPolicy
from registry.generations import (
    CURRENT,
    GENERATION_FILE,
    STAMP_FILE,
    Generation,
    Record,
    entry_files,
    entry_paths,
    fallback,
    generation_dirs,
    is_real_dir,
    linked,
    number,
    read_record,
    record_unreadable,
)
from registry.keys import Key

log = logging.getLogger(__name__)
EXACT = MatchPolicy.EXACT

QUARANTINE = "quarantine"
KEEP_GENERATIONS = 8
MAX_ENTRY_BYTES = 2**20  # an entry is a few KiB; anything bigger is not one
QUARANTINE_LOCK_S = 1.0  # a reader moving a corrupt file aside waits this long at most
RECOVERY_BUDGET_S = 2.0  # a write spends at most this clearing killed writers' debris
StatKey = tuple[int, int, int]


@dataclass
class _Loaded:
    """Parsed entries of one generation, with the file stats that let a reload skip them."""

    version: tuple[object, ...] = ()
    by_slot: dict[tuple[str, str], dict[str, Entry]] = field(default_factory=dict)
    by_path: dict[str, tuple[StatKey, Entry]] = field(default_factory=dict)
    refused: dict[str, StatKey] = field(default_factory=dict)  # not re-read while unchanged


@dataclass(frozen=True)
class Fence:
    """What a writer saw in an entry's file before it decided to write it (``seen``: a
    digest of its bytes, "" for no file); a put with the fence lands only if the file
    still holds that. JSON-able, so ranks can pass it on."""

    relpath: str
    seen: str

    def to_json(self) -> dict[str, str]:
        return {"relpath": self.relpath, "seen": self.seen}

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> Fence:
        return cls(str(data["relpath"]), str(data["seen"]))


def _check_root(root: Path) -> None:
    """:class:`RegistryError` unless ``root`` is a folder, saying how to create a store."""
    if root.is_dir():
        return
    state = "is not a folder" if root.exists() else "does not exist"
    raise RegistryError(
        f"Store '{root}' {state}; check the path, or create the store: "
        "Store(path, create=True), or the CLI's --create-store."
    )


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
            _check_root(self.root)
        self.lock_timeout = lock_timeout
        self.check_interval = check_interval
        self.keep_generations = max(2, keep_generations)
        self.recovery_budget_s = recovery_budget_s
        self.quarantined = 0
        self.skipped = 0
        self.recovered: dict[str, int] = {}  # what killed writers left, by kind: a metric
        self._debris: Iterator[Path | None] | None = None  # the walk for .tmp-* files, resumed
        self._debris_cleared = False
        self._garbage_cursor = -1  # the garbage collector stopped after this generation
        self._loaded = _Loaded()
        self._checked_at = -1.0
        self._lock = FileLock(str(self.root / ".store.lock"), timeout=lock_timeout)

    # ---- reading -------------------------------------------------------------------

    def lookup(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy = EXACT
    ) -> Entry | None:
        """The entry for ``kernel`` at ``key`` valid for ``fingerprint``, or None (a miss)."""
        self.refresh()
        candidates = self._loaded.by_slot.get((kernel, canonical_key(key)), {})
        return keys.best_fit(candidates, fingerprint, policy)

    def explain_miss(
        self, kernel: str, key: Mapping[str, Any], fingerprint: Fingerprint
    ) -> list[dict[str, tuple[object, object]]]:
        """For a miss: the fields in which each stored entry of this slot differs."""
        self.refresh()
        candidates = self._loaded.by_slot.get((kernel, canonical_key(key)), {})
        return [fingerprint.diff(e.fingerprint) for e in candidates.values()]

    def nearest(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy = EXACT
    ) -> Entry | None:
        """The stored entry of ``kernel`` nearest to ``key`` (:func:`registry.keys.nearest`):
        the config a miss falls back to."""
        return keys.nearest(self.entries(), kernel, key, fingerprint, policy)

    def like(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy, *, free: str
    ) -> dict[Any, Entry]:
        """The entry :meth:`lookup` finds for each stored value of the ``free`` field, among
        the keys equal to ``key`` but for it: one layer's tuned Ms, by M. Read from one
        loaded generation."""
        self.refresh()
        wanted, found = keys.without(key, free), {}
        for (slot_kernel, _), candidates in self._loaded.by_slot.items():
            if slot_kernel != kernel:
                continue
            held = next(iter(candidates.values())).key  # a slot's entries share one key
            if free in held and keys.without(held, free) == wanted:
                entry = keys.best_fit(candidates, fingerprint, policy)
                if entry is not None:
                    found[held[free]] = entry
        return dict(sorted(found.items()))

    def entries(self) -> list[Entry]:
        """Every loaded entry, in path order."""
        self.refresh()
        return [e for _, (_, e) in sorted(self._loaded.by_path.items())]

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
        version = self._version()
        if not force and version == self._loaded.version and version:
            return False
        self._loaded = self._load(version)
        return True

    def current_generation(self) -> Path | None:
        """The generation readers see: the one ``current`` links to or, while that link
        is missing or broken, the one a repair would restore (never an empty view)."""
        folder = self.root / CURRENT  # a copy tool may have made the link a folder
        return linked(self.root) or (folder if is_real_dir(folder) else fallback(self.root))

    def record(self, generation: Path | None = None) -> Record | None:
        """The record of ``generation`` (default: current); None when it is unsealed."""
        generation = generation or self.current_generation()
        return read_record(generation) if generation is not None else None

    def generations(self) -> list[Generation]:
        """Every sealed generation, oldest first, the current one marked."""
        current = self.current_generation()
        out = []
        for gen in generation_dirs(self.root):
            record = self.record(gen)
            if record is not None:
                is_current = current is not None and gen.name == current.name
                out.append(Generation(record, current=is_current))
        return out

    def _version(self) -> tuple[object, ...]:
        gen = self.current_generation()
        if gen is None:
            return ()
        try:
            st = os.stat(gen / STAMP_FILE)
        except OSError:
            return (gen.name,)
        return (gen.name, st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self, version: tuple[object, ...]) -> _Loaded:
        gen = self.root / str(version[0]) if version else None  # resolved once, by _version
        loaded = _Loaded(version=version)
        if gen is None:
            return loaded
        previous = self._loaded
        for path in entry_files(gen):
            rel = path.relative_to(gen).as_posix()
            try:
                st = path.lstat()
            except OSError:
                continue  # replaced or quarantined while we walked
            stat_key = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = previous.by_path.get(rel)
            if previous.refused.get(rel) == stat_key:
                loaded.refused[rel] = stat_key
                continue
            entry = cached[1] if cached and cached[0] == stat_key else self._read(gen, path)
            if isinstance(entry, _Unread):
                continue  # a passing fault (EIO, EACCES): read again at the next reload
            if entry is None:
                loaded.refused[rel] = stat_key  # not re-read while it stays as it is
                continue
            loaded.by_path[rel] = (stat_key, entry)
            slot = loaded.by_slot.setdefault((entry.kernel, entry.key_json), {})
            slot[entry.fingerprint.digest()] = entry
        return loaded

    def _read(self, gen: Path, path: Path) -> Entry | _Unread | None:
        """The entry in ``path``; None when its content is not one (quarantined) or is
        a newer schema's; ``_UNREAD`` when the file could not be read this time."""
        try:
            return read_entry(path)[1]
        except FileNotFoundError:
            return None
        except NewerSchema as e:
            self.skipped += 1  # written by a newer version sharing the volume: leave it alone
            log.warning("skipping %s: %s", path, e)
            return None
        except RegistryError as e:
            self._quarantine(gen, path, str(e))
            return None
        except OSError as e:  # EIO passes
            log.warning("cannot read registry file %s now: %s", path, e)
            return _UNREAD

    def _quarantine(self, gen: Path, path: Path, reason: str) -> None:
        """Move a corrupt file aside so readers stop tripping on it; its key becomes a miss.
        A reader does not wait for the write lock: a busy or read-only store keeps the
        file where it is (skipped all the same), and the next reader moves it."""
        rel = path.relative_to(gen).as_posix().replace("/", "__")
        target = self._quarantine_path(f"{gen.name}-{rel}")
        try:
            with self._locked(timeout=QUARANTINE_LOCK_S):
                if _still_corrupt(path):
                    self._set_aside(path, target, reason)
                    log.error(
                        "quarantined corrupt registry file %s (%s) -> %s", path, reason, target
                    )
        except (OSError, RegistryError) as e:  # a read-only mount, a busy lock: skip it
            log.warning("corrupt registry file %s (%s) left in place: %s", path, reason, e)

    def _quarantine_path(self, name: str) -> Path:
        """A fresh name in quarantine/: the time, then a random part (never overwritten)."""
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        return self.root / QUARANTINE / f"{stamp}-{name}"

    def _move_aside(self, path: Path, target: Path, reason: str) -> None:
        folder = target.parent
        if os.path.lexists(folder) and not is_real_dir(folder):  # a file where it belongs
            _rename_aside(folder)
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        atomic.write_bytes(target.with_name(target.name + ".reason"), reason.encode())

    def _set_aside(self, path: Path, target: Path, reason: str) -> None:
        """Quarantine a file that holds no entry, and count it."""
        self._move_aside(path, target, reason)
        self.quarantined += 1

    def quarantined_files(self) -> int:
        """Files and folders in quarantine/, moved there by any process: what a metric shows."""
        try:
            return sum(1 for p in (self.root / QUARANTINE).iterdir() if p.suffix == ".reason")
        except OSError:
            return 0

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
        fence = Fence(relpath, _seen(gen / relpath))
        self._catch_up(gen, relpath)
        return fence

    def _catch_up(self, gen: Path, relpath: str) -> None:
        """Reload unless the loaded entries hold ``relpath`` of ``gen`` as it is now, so
        that a lookup sees at least what a fence saw (a writer replaces the ``.stamp``,
        which tells readers to reload, only after the entry)."""
        loaded = self._loaded
        held = loaded.by_path.get(relpath)
        stat_key = held[0] if held is not None else loaded.refused.get(relpath)
        if loaded.version[:1] != (gen.name,) or _stat_key(gen / relpath) != stat_key:
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
            gen = self._ensure_generation()
            if fence is not None:
                self._check_fence(gen, entries, fence)
            stored = [self._merge_into(gen, e) for e in entries]
            self._touch_stamp(gen)
        self.refresh(force=True)
        return stored

    def _check_fence(self, gen: Path, entries: list[Entry], fence: Fence) -> None:
        if [e.relpath().as_posix() for e in entries] != [fence.relpath]:
            raise RegistryError(
                f"Store {self.root}: a fence for {fence.relpath} guards a put of that entry "
                f"alone, not of {[e.relpath().as_posix() for e in entries]}."
            )
        if _seen(gen / fence.relpath) != fence.seen:
            raise Superseded(fence.relpath)

    def install(
        self,
        entries: Iterable[Entry],
        *,
        record: Mapping[str, Any],
        after_swap: Callable[[], None] | None = None,
        before_seal: Callable[[], Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Make a new generation = current + ``entries`` and swap it in with one rename.

        ``record`` describes the change (a bundle's name and version); it lands in the
        generation's GENERATION.json together with the paths it changed, for rollback.
        ``after_swap`` runs right after the swap, still under the lock (a bundle moves its
        artifacts into the cache there); if it fails, the failure is logged and the swap
        stands. ``before_seal`` runs under the lock before the record is sealed; what it
        returns joins the record (a bundle notes what it will replace outside the store).
        """
        entries = list(entries)
        with self._writing():
            parent = self._ensure_generation()
            new = self._fork(parent)
            changed = sorted({e.relpath().as_posix() for e in entries})
            for e in entries:
                self._merge_into(new, e)
            extra = before_seal() if before_seal is not None else {}
            info = self._seal(
                new, parent, {"kind": "install", **record, **extra, "changed": changed}
            )
            self._swap_sealed(new)
            self._after_swap(after_swap, new)
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
            current = self._ensure_generation()
            target = self._latest_undoable_install(current)
            parent = self.root / str(target.parent)
            if not (parent / GENERATION_FILE).exists():
                raise RegistryError(
                    f"Cannot roll back {target.id}: its parent generation "
                    f"{target.parent} is gone (kept: {self.keep_generations})."
                )
            new = self._fork(current)
            for rel in target.changed:
                _unlink_quiet(new / rel)
                if (parent / rel).exists():
                    (new / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.link(parent / rel, new / rel)
            info = self._seal(
                new,
                current,
                {"kind": "rollback", "undoes": target.id, "bundle": target.extra.get("bundle")},
            )
            self._swap_sealed(new)
            self._after_swap(after_swap and functools.partial(after_swap, target), new)
            self._collect_garbage()
        self.refresh(force=True)
        return info

    def _after_swap(self, step: Callable[[], None] | None, new: Path) -> None:
        if step is None:
            return
        try:
            step()
        except Exception:
            log.exception("store %s: %s is in, but its after-swap step failed", self.root, new.name)

    def _latest_undoable_install(self, current: Path) -> Record:
        undone: set[str] = set()
        gen: Path | None = current
        while gen is not None and (record := read_record(gen)) is not None:
            if record.kind == "rollback":
                undone.add(str(record.undoes))
            elif record.kind == "install" and record.id not in undone:
                return record
            elif record.kind == "repair":  # its record, with what it changed, was lost
                raise RegistryError(
                    f"Store {self.root}: generation {record.id} was repaired "
                    f"({record.extra.get('reason')}), so what it changed is unknown; "
                    "roll back by hand from a bundle."
                )
            gen = self.root / record.parent if record.parent else None  # parents are older
        if gen is not None:
            raise RegistryError(
                f"Store {self.root}: no bundle install to roll back among the kept generations "
                f"({gen.name} and older are gone; kept: {self.keep_generations})."
            )
        raise RegistryError(f"Store {self.root}: no bundle install left to roll back.")

    def recover(self, *, budget_s: float = math.inf) -> dict[str, Any]:
        """Clean up after crashes: repair ``current`` and its record, remove ``.tmp-*``
        files left by killed writers and unsealed generations (a crashed install; one
        holding entries the current one lacks goes to quarantine instead). Every writer's
        first write does the same within a time budget (module docstring); ``budget_s``
        bounds this call likewise (checked per folder walked and per generation), the rest
        left to the next write (then the report has ``"unfinished": True``). Returns what
        it did; safe to call any time (it takes the write lock)."""
        deadline = time.monotonic() + budget_s
        walk = _temp_files(self.root)
        with self._locked():
            report: dict[str, Any] = {"repaired": self._repair()}
            report["temp_files"], walked = self._remove_temp_files(walk, deadline)
            report["generations"], collected = {"removed": [], "quarantined": []}, False
            if walked:
                report["generations"], collected = self._collect_garbage_until(deadline)
        if not (walked and collected):
            report["unfinished"] = True
        self._count_recovered(report)
        if report["temp_files"] or any(report["generations"].values()) or report["repaired"]:
            log.warning("store %s recovered: %s", self.root, report)
        self._debris_cleared = walked and collected
        self._debris = None if self._debris_cleared else walk
        self.refresh(force=True)
        return report

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The write lock, and what killed writers left cleared first (within a budget)."""
        with self._locked():
            if not self._debris_cleared:
                self._clear_debris()
            yield

    def _clear_debris(self) -> None:
        """:meth:`recover`'s work, bounded by ``recovery_budget_s``: the walk for temp
        files goes on where it stopped at the next write (under the lock any such file is
        a dead writer's, whenever it was listed); generations are looked at afresh."""
        started = time.monotonic()
        deadline = started + self.recovery_budget_s
        report: dict[str, Any] = {"repaired": ""}
        if self._debris is None:
            report["repaired"] = self._repair()
            self._debris = _temp_files(self.root)
        report["temp_files"], walked = self._remove_temp_files(self._debris, deadline)
        report["generations"], collected = {}, False
        if walked:
            report["generations"], collected = self._collect_garbage_until(deadline)
        self._debris_cleared = walked and collected
        if self._debris_cleared:
            self._debris = None
        self._count_recovered(report)
        self._log_recovery(report, time.monotonic() - started)

    def _remove_temp_files(
        self, paths: Iterator[Path | None], deadline: float
    ) -> tuple[list[str], bool]:
        """Remove the ``.tmp-*`` files ``paths`` names (None: a folder walked) until
        ``deadline``; the names removed, and whether ``paths`` ran out."""
        removed: list[str] = []
        for path in paths:
            if path is None:
                if time.monotonic() >= deadline:
                    return removed, False
                continue
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if is_real_dir(path) else path.unlink()
                removed.append(path.relative_to(self.root).as_posix())
            if time.monotonic() >= deadline:
                return removed, False
        return removed, True

    def _count_recovered(self, report: Mapping[str, Any]) -> None:
        generations = report.get("generations") or {}
        counts = {
            "temp_files": len(report.get("temp_files", [])),
            "generations_removed": len(generations.get("removed", [])),
            "generations_quarantined": len(generations.get("quarantined", [])),
            "repairs": 1 if report.get("repaired") else 0,
        }
        for what, n in counts.items():
            if n:
                self.recovered[what] = self.recovered.get(what, 0) + n

    def _log_recovery(self, report: Mapping[str, Any], seconds: float) -> None:
        generations = report.get("generations") or {}
        removed, quarantined = generations.get("removed", []), generations.get("quarantined", [])
        if not (report["temp_files"] or removed or quarantined or report["repaired"]):
            return
        log.warning(
            "store %s: cleared what killed writers left in %.2f s: %d temp files, "
            "generations removed %s, quarantined %s%s%s",
            self.root,
            seconds,
            len(report["temp_files"]),
            removed,
            quarantined,
            f", repaired: {report['repaired']}" if report["repaired"] else "",
            "" if self._debris_cleared else "; the rest at the next write",
        )

    @contextlib.contextmanager
    def _locked(self, timeout: float | None = None) -> Iterator[None]:
        if self.create:
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            _check_root(self.root)  # removed since it was opened: not made again unasked
        wait = self.lock_timeout if timeout is None else timeout
        lock_file = Path(self._lock.lock_file)
        aside = self._lock_folder_aside(lock_file)
        try:
            with self._lock.acquire(timeout=wait):
                if aside is not None:  # its reason is written under the lock, as all writes
                    reason = "a folder where the write lock file belongs"
                    atomic.write_bytes(aside.with_name(aside.name + ".reason"), reason.encode())
                    log.error("store %s: %s -> %s", self.root, reason, aside)
                yield
        except FileLockTimeout:
            raise RegistryError(
                f"Store {self.root}: write lock not acquired within {wait:g} s."
            ) from None

    def _lock_folder_aside(self, lock_file: Path) -> Path | None:
        """A folder where the lock file belongs, moved to quarantine (nobody can hold a
        folder, so moving it takes no lock from anyone); where it went, or None. Any other
        odd object (a fifo) stays: flock works on it, and someone may hold it."""
        if not is_real_dir(lock_file):
            return None
        target = self._quarantine_path(lock_file.name)
        folder = target.parent
        if os.path.lexists(folder) and not is_real_dir(folder):
            _rename_aside(folder)
        folder.mkdir(parents=True, exist_ok=True)
        try:  # the slash: only a folder is moved (ENOTDIR for the file another writer holds)
            os.rename(str(lock_file) + "/", target)
        except (FileNotFoundError, NotADirectoryError):  # another writer moved it first
            return None
        return target

    def _merge_into(self, gen: Path, entry: Entry) -> Entry:
        """Merge ``entry`` with what its file holds. Only a missing file counts as empty:
        a corrupt one is quarantined first, a newer schema's is left alone, and a read
        that fails (EIO) fails the write rather than overwrite a tuning it did not see."""
        path = gen / entry.relpath()
        self._clear_the_way(gen, path)
        merged, held = entry, None
        try:
            held, stored = read_entry(path)
            merged = stored.merge(entry)
        except FileNotFoundError:
            pass
        except NewerSchema:
            log.warning("not writing %s: a newer version's entry holds the slot", path)
            return entry
        except RegistryError as e:
            self._set_aside(path, self._quarantine_path(f"{gen.name}-{path.name}"), str(e))
        data = atomic.dumps(merged.to_json()).encode()
        if held != data:  # an idempotent replay writes nothing
            atomic.write_bytes(path, data)
        return merged

    def _clear_the_way(self, gen: Path, path: Path) -> None:
        """A file where a folder of ``path`` belongs, or a folder where the entry file
        belongs, is moved to quarantine: one stray object never blocks a slot's writes."""
        rel = path.relative_to(gen)
        for part in [*reversed(rel.parents[:-1]), rel]:  # the folders outermost first, the file
            spot = gen / part
            try:
                is_dir = stat.S_ISDIR(os.lstat(spot).st_mode)  # one lstat; a link is no folder
            except OSError:
                break  # missing: nothing below it exists either
            if is_dir if part == rel else not is_dir:
                name = f"{gen.name}-{part.as_posix().replace('/', '__')}"
                self._move_aside(spot, self._quarantine_path(name), "in the way of an entry")

    def _ensure_generation(self) -> Path:
        """The current generation, repaired first where its link or record is broken."""
        self._repair()
        gen = linked(self.root)
        assert gen is not None  # _repair leaves a link to a sealed generation
        return gen

    def _repair(self) -> str:
        """Make ``current`` a link to a sealed generation, from what is on disk, never by
        starting empty while a generation holds entries. Returns what it did, or ''."""
        link = self.root / CURRENT
        gen = linked(self.root)
        fresh = not os.path.lexists(link) and not generation_dirs(self.root)
        if gen is not None:
            if read_record(gen) is not None:
                return ""
            self._reseal(gen, "its GENERATION.json was missing or unreadable")
            return f"resealed {gen.name}"
        if link.is_dir() and not link.is_symlink():  # a copy that followed the link
            adopted = self._new_generation_dir()
            os.rename(link, adopted)
            self._reseal(adopted, "'current' was a folder, not a link")
            self._swap(adopted)
            return f"adopted the folder 'current' as {adopted.name}"
        if os.path.lexists(link) and not link.is_symlink():
            self._move_aside(link, self._quarantine_path(CURRENT), "'current' was not a link")
        target = fallback(self.root)
        if target is None:
            target = self._new_generation_dir()
            self._seal(target, None, {"kind": "init"})
        elif read_record(target) is None:
            self._reseal(target, "'current' was missing or broken")
        self._swap(target)
        return "" if fresh else f"pointed 'current' at {target.name}"

    def _reseal(self, gen: Path, why: str) -> None:
        """Seal a generation whose record is gone, keeping its entries and a broken record."""
        record = gen / GENERATION_FILE
        if os.path.lexists(record):
            self._move_aside(record, self._quarantine_path(f"{gen.name}-{GENERATION_FILE}"), why)
        older = [
            g for g in generation_dirs(self.root) if number(g) < number(gen) and read_record(g)
        ]
        log.warning("store %s: resealing %s (%s)", self.root, gen.name, why)
        self._seal(gen, older[-1] if older else None, {"kind": "repair", "reason": why})

    def _fork(self, parent: Path) -> Path:
        """A new generation holding hard links to every entry file of ``parent``."""
        new = self._new_generation_dir()
        for path in entry_files(parent):
            dst = new / path.relative_to(parent)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dst)
        return new

    def _new_generation_dir(self) -> Path:
        # every generation name, a stray file's too (anything else numbers -1)
        numbers = [number(self.root / name) for name in os.listdir(self.root)]
        new = self.root / f"gen-{max([0, *numbers]) + 1:06d}"
        new.mkdir(parents=True)
        return new

    def _seal(self, gen: Path, parent: Path | None, record: Mapping[str, Any]) -> dict[str, Any]:
        info = {
            "id": gen.name,
            "parent": parent.name if parent else None,
            "created": now_iso(),
            **record,
        }
        self._touch_stamp(gen)
        self._clear_marker(gen, GENERATION_FILE)
        atomic.write_json(gen / GENERATION_FILE, info)
        return info

    def _swap(self, gen: Path) -> None:
        atomic.replace_symlink(self.root / CURRENT, gen.name)
        log.info("store %s: current generation is now %s", self.root, gen.name)

    def _swap_sealed(self, gen: Path) -> None:
        """Swap in a new generation; if the swap fails (a full disk), unseal it, so that no
        repair ever mistakes it for the generation in use."""
        try:
            self._swap(gen)
        except BaseException:
            with contextlib.suppress(OSError):
                (gen / GENERATION_FILE).unlink()
            raise

    def _touch_stamp(self, gen: Path) -> None:
        self._clear_marker(gen, STAMP_FILE)
        atomic.write_bytes(gen / STAMP_FILE, secrets.token_hex(8).encode())

    def _clear_marker(self, gen: Path, name: str) -> None:
        """A folder, fifo or other non-file where the marker ``name`` of ``gen`` belongs
        goes to quarantine, so that writing the marker does not fail (a link is replaced
        by the write itself)."""
        path = gen / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            return
        kind = "a folder" if stat.S_ISDIR(mode) else "no regular file"
        target = self._quarantine_path(f"{gen.name}-{name}")
        self._set_aside(path, target, f"{kind} where the marker {name} belongs")
        log.error("store %s: %s where %s belongs -> %s", self.root, kind, path, target)

    def _collect_garbage(self) -> dict[str, list[str]]:
        """Drop generations nobody needs (:meth:`_garbage`): what it did."""
        return self._collect_garbage_until(math.inf)[0]

    def _collect_garbage_until(self, deadline: float) -> tuple[dict[str, list[str]], bool]:
        """Drop generations nobody needs until ``deadline``: what it did, and whether it
        looked at them all."""
        done: dict[str, list[str]] = {"removed": [], "quarantined": []}
        for what, name in self._garbage(after=self._garbage_cursor):
            self._garbage_cursor = number(Path(name))  # the next call goes on after it
            if what in done:
                done[what].append(name)
            if time.monotonic() >= deadline:
                return done, False
        self._garbage_cursor = -1
        return done, True

    def _garbage(self, *, after: int = -1) -> Iterator[tuple[str, str]]:
        """Drop generations nobody needs, one at a time: never the current one or the
        newest kept, never one holding an entry the current one lacks (unless a rollback
        undid exactly that install). An unsealed one (a crashed install) that holds such
        entries is moved to quarantine, not deleted. Yields ("removed" or "quarantined",
        its name), or ("kept", its name) for one it read and kept, so that its caller's
        deadline is checked per generation. ``after``: only generations numbered above it
        (where a call stopped early went; skipping one only keeps it a while longer)."""
        current = linked(self.root)
        if current is None:
            return  # a repair decides first which generation is current
        gens = generation_dirs(self.root)
        records = {g.name: read_record(g) for g in gens}
        sealed = [g for g in gens if records[g.name] is not None]
        keep = {current.name, *(g.name for g in sealed[-self.keep_generations :])}
        undone = {r.undoes for r in records.values() if r is not None and r.kind == "rollback"}
        held: set[str] | None = None
        for gen in gens:
            record = records[gen.name]
            never_current = record is None or number(gen) > number(current)
            if gen.name == current.name or (gen.name in keep and not never_current):
                continue
            if number(gen) <= after or (record is None and record_unreadable(gen)):
                continue  # an unreadable record (EIO) is no sign of a crashed install
            held = entry_paths(current) if held is None else held
            lacking = entry_paths(gen) - held
            if record is not None and record.id in undone:
                lacking -= set(record.changed)
            if never_current and lacking:  # a crashed install, before its seal or its swap
                target = self._quarantine_path(f"{gen.name}-never-current")
                self._move_aside(
                    gen, target, f"a generation never swapped in, {len(lacking)} entries"
                )
                yield "quarantined", gen.name
            elif not lacking:
                shutil.rmtree(gen, ignore_errors=True)
                yield "removed", gen.name
            else:
                yield "kept", gen.name


def _stat_key(path: Path) -> StatKey | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _seen(path: Path) -> str:
    """What a fence records of the entry file ``path``: a digest of its bytes; "" when
    there is none; a mark for an object that is no regular file (a put clears it)."""
    try:
        return hashlib.sha256(atomic.read_bounded(path, MAX_ENTRY_BYTES)).hexdigest()[:32]
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except ValueError as e:  # a fifo, a folder, too big: no entry
        return f"no entry: {e}"
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR):
            return f"no entry: {e.strerror}"
        raise


def _temp_files(root: Path) -> Iterator[Path | None]:
    """Leftovers of an atomic write whose process died (``.tmp-*``), anywhere under
    ``root`` but inside what quarantine/ keeps (whole generations, never written to);
    then None once per folder, so that a caller can stop in time."""
    for dirpath, dirs, files in os.walk(root):
        folder = Path(dirpath)
        temps = [name for name in (*files, *dirs) if name.startswith(atomic.TEMP_PREFIX)]
        walk_on = folder != root / QUARANTINE
        dirs[:] = [d for d in dirs if walk_on and not d.startswith(atomic.TEMP_PREFIX)]
        yield from (folder / name for name in temps)
        yield None  # the next folder is listed only if there is time left


def read_entry(path: Path) -> tuple[bytes, Entry]:
    """The bytes of ``path`` and the entry they hold. :class:`NewerSchema` for a newer
    version's entry, RegistryError for anything else that is no entry (not a small
    regular file, a link, not JSON, a wrong type), OSError when it cannot be read now
    (EIO, EACCES: not the file's fault)."""
    try:
        raw = atomic.read_bounded(path, MAX_ENTRY_BYTES)
        data = atomic.loads(raw)
    except ValueError as e:
        raise RegistryError(f"not an entry file: {e}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link where an entry belongs
            raise RegistryError(str(e)) from None
        raise
    return raw, Entry.from_json(data)  # NewerSchema: a newer version's


def _still_corrupt(path: Path) -> bool:
    """Whether ``path`` still holds no entry (a writer may have replaced it meanwhile);
    a file this process cannot read now (EACCES, EIO) is not called corrupt."""
    try:
        read_entry(path)
    except OSError:
        return False
    except RegistryError:
        return True
    return False


class _Unread:
    """The marker of an entry file that could not be read this time."""


_UNREAD = _Unread()


def _unlink_quiet(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _rename_aside(path: Path) -> None:
    """``path`` renamed to ``<name>.<random hex>`` beside it: out of the way, kept."""
    os.replace(path, path.with_name(f"{path.name}.{secrets.token_hex(3)}"))
