"""Writing a store's entry files: an entry merged with what its file holds, the file
replaced atomically, and the fence that lets a put land only if nobody wrote since.

Everything here runs under the store's write lock (:class:`registry.storage.write_lock.WriteLock`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from registry.core import atomic
from registry.core.entry import Entry, NewerSchema
from registry.core.errors import RegistryError, Superseded
from registry.storage.entry_reader import MAX_ENTRY_BYTES, read_entry
from registry.storage.quarantine import Quarantine

log = logging.getLogger("registry.storage.store")  # the store's log lines keep their logger's name


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


def seen(path: Path) -> str:
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


class EntryWriter:
    """Writes entries into the generations of the store at ``root``; what holds no entry,
    or stands in an entry's way, goes to ``quarantine``."""

    def __init__(self, root: Path, quarantine: Quarantine) -> None:
        self.root = root
        self.quarantine = quarantine

    def check_fence(self, gen: Path, entries: list[Entry], fence: Fence) -> None:
        """:class:`Superseded` unless ``gen`` still holds what ``fence`` saw; a fence
        guards a put of its own entry alone (:class:`RegistryError` otherwise)."""
        if [e.relpath().as_posix() for e in entries] != [fence.relpath]:
            raise RegistryError(
                f"Store {self.root}: a fence for {fence.relpath} guards a put of that entry "
                f"alone, not of {[e.relpath().as_posix() for e in entries]}."
            )
        if seen(gen / fence.relpath) != fence.seen:
            raise Superseded(fence.relpath)

    def merge_into(self, gen: Path, entry: Entry) -> Entry:
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
            self.quarantine.set_aside(path, self.quarantine.path(f"{gen.name}-{path.name}"), str(e))
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
                self.quarantine.move_aside(
                    spot, self.quarantine.path(name), "in the way of an entry"
                )
