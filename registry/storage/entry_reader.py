"""Reading a store's entry files: one generation's files parsed into a :class:`Loaded`
view, a reload reusing the parse of every file whose stat is unchanged.

A file that holds no entry is moved to quarantine (its key becomes a miss), one a newer
version wrote is skipped, and one that cannot be read now (EIO, EACCES) is read again at
the next reload. Nothing here raises for what a file holds.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.core import atomic
from registry.core.entry import Entry, NewerSchema, canonical_key
from registry.core.errors import RegistryError
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.storage import keys
from registry.storage.generations import STAMP_FILE, current, entry_files
from registry.storage.keys import Key
from registry.storage.quarantine import Quarantine
from registry.storage.write_lock import WriteLock

log = logging.getLogger("registry.storage.store")  # the store's log lines keep their logger's name

MAX_ENTRY_BYTES = 2**20  # an entry is a few KiB; anything bigger is not one
QUARANTINE_LOCK_S = 1.0  # a reader moving a corrupt file aside waits this long at most
StatKey = tuple[int, int, int]


@dataclass
class Loaded:
    """Parsed entries of one generation, with the file stats that let a reload skip them."""

    version: tuple[object, ...] = ()
    by_slot: dict[tuple[str, str], dict[str, Entry]] = field(default_factory=dict)
    by_path: dict[str, tuple[StatKey, Entry]] = field(default_factory=dict)
    refused: dict[str, StatKey] = field(default_factory=dict)  # not re-read while unchanged

    def slot(self, kernel: str, key: Key) -> dict[str, Entry]:
        """The entries of ``kernel`` at ``key``, by fingerprint digest."""
        return self.by_slot.get((kernel, canonical_key(key)), {})

    def entries(self) -> list[Entry]:
        """Every entry, in path order."""
        return [e for _, (_, e) in sorted(self.by_path.items())]

    def like(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy, *, free: str
    ) -> dict[Any, Entry]:
        """The best fit (:func:`registry.storage.keys.best_fit`) for each value of the
        ``free`` field among ``kernel``'s keys equal to ``key`` but for it, by that value."""
        wanted, found = keys.without(key, free), {}
        for (slot_kernel, _), candidates in self.by_slot.items():
            if slot_kernel != kernel:
                continue
            held = next(iter(candidates.values())).key  # a slot's entries share one key
            if free in held and keys.without(held, free) == wanted:
                entry = keys.best_fit(candidates, fingerprint, policy)
                if entry is not None:
                    found[held[free]] = entry
        return dict(sorted(found.items()))

    def holds(self, gen: Path, relpath: str) -> bool:
        """Whether this view was read from ``gen`` and holds ``relpath`` as it is now (an
        entry, or a file refused while unchanged)."""
        held = self.by_path.get(relpath)
        held_key = held[0] if held is not None else self.refused.get(relpath)
        return self.version[:1] == (gen.name,) and stat_key(gen / relpath) == held_key


class EntryReader:
    """Reads the generation readers see of the store at ``root`` into a :class:`Loaded`.

    ``skipped``: entries this process left alone because a newer version wrote them.
    A corrupt file is moved to ``quarantine`` under ``lock``, waiting for it briefly.
    """

    def __init__(self, root: Path, lock: WriteLock, quarantine: Quarantine) -> None:
        self.root = root
        self.lock = lock
        self.quarantine = quarantine
        self.skipped = 0

    def version(self) -> tuple[object, ...]:
        """What a load would read now (generation, stamp): () for a store never written."""
        gen = current(self.root)
        if gen is None:
            return ()
        try:
            st = os.stat(gen / STAMP_FILE)
        except OSError:
            return (gen.name,)
        return (gen.name, st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self, version: tuple[object, ...], previous: Loaded) -> Loaded:
        """The entries of the generation ``version`` names, reusing ``previous``'s parse
        of every file unchanged since (and its refusal of every bad one)."""
        gen = self.root / str(version[0]) if version else None  # resolved once, by version()
        loaded = Loaded(version=version)
        if gen is None:
            return loaded
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
            entry = cached[1] if cached and cached[0] == stat_key else self.read(gen, path)
            if isinstance(entry, _Unread):
                continue  # a passing fault (EIO, EACCES): read again at the next reload
            if entry is None:
                loaded.refused[rel] = stat_key  # not re-read while it stays as it is
                continue
            loaded.by_path[rel] = (stat_key, entry)
            slot = loaded.by_slot.setdefault((entry.kernel, entry.key_json), {})
            slot[entry.fingerprint.digest()] = entry
        return loaded

    def read(self, gen: Path, path: Path) -> Entry | _Unread | None:
        """The entry in ``path``; None when its content is not one (quarantined) or is
        a newer schema's; ``UNREAD`` when the file could not be read this time."""
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
            return UNREAD

    def _quarantine(self, gen: Path, path: Path, reason: str) -> None:
        """Move a corrupt file aside so readers stop tripping on it; its key becomes a miss.
        A reader does not wait for the write lock: a busy or read-only store keeps the
        file where it is (skipped all the same), and the next reader moves it."""
        rel = path.relative_to(gen).as_posix().replace("/", "__")
        target = self.quarantine.path(f"{gen.name}-{rel}")
        try:
            with self.lock.hold(timeout=QUARANTINE_LOCK_S):
                if _still_corrupt(path):
                    self.quarantine.set_aside(path, target, reason)
                    log.error(
                        "quarantined corrupt registry file %s (%s) -> %s", path, reason, target
                    )
        except (OSError, RegistryError) as e:  # a read-only mount, a busy lock: skip it
            log.warning("corrupt registry file %s (%s) left in place: %s", path, reason, e)


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


def stat_key(path: Path) -> StatKey | None:
    """What a reload compares of an entry file (inode, mtime, size); None when it is gone."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


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


UNREAD = _Unread()
