"""Writing a store's generations: fork, seal and swap one in, install a bundle's entries,
roll an install back, repair a broken ``current`` or record; old generations are
collected by :class:`registry.storage.garbage.GarbageCollector`.

A new generation is built beside the current one from hard links, sealed (its
``GENERATION.json``), then swapped in by one rename of ``current``: readers see all of it
or none of it. Everything here runs under the store's write lock
(:class:`registry.storage.write_lock.WriteLock`); :mod:`registry.storage.generations` only reads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from registry.core import atomic
from registry.core.entry import Entry, now_iso
from registry.core.errors import RegistryError
from registry.storage.entry_writer import EntryWriter
from registry.storage.garbage import GarbageCollector
from registry.storage.generations import (
    CURRENT,
    GENERATION_FILE,
    STAMP_FILE,
    Record,
    entry_files,
    fallback,
    generation_dirs,
    linked,
    number,
    read_record,
)
from registry.storage.quarantine import Quarantine

log = logging.getLogger("registry.storage.store")  # the store's log lines keep their logger's name


class GenerationWriter:
    """Makes, swaps and drops the generations of the store at ``root``, keeping the
    newest ``keep`` sealed ones (at least 2) for rollback; ``writer`` merges entries into
    a new generation, and what is in the way goes to ``quarantine``."""

    def __init__(
        self, root: Path, writer: EntryWriter, quarantine: Quarantine, *, keep: int
    ) -> None:
        self.root = root
        self.writer = writer
        self.quarantine = quarantine
        self.keep = max(2, keep)
        self.collector = GarbageCollector(root, quarantine, keep=self.keep)

    # ---- changes -------------------------------------------------------------------

    def install(
        self,
        entries: Sequence[Entry],
        *,
        record: Mapping[str, Any],
        after_swap: Callable[[], None] | None = None,
        before_seal: Callable[[], Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Make a new generation = current + ``entries``, seal it with ``record`` (plus
        what ``before_seal`` returns and the paths it changed) and swap it in; then run
        ``after_swap``, whose failure is logged and leaves the swap standing. Returns the
        new record; the caller collects garbage next (:meth:`collect_garbage`)."""
        parent = self.ensure()
        new = self.fork(parent)
        changed = sorted({e.relpath().as_posix() for e in entries})
        for e in entries:
            self.writer.merge_into(new, e)
        extra = before_seal() if before_seal is not None else {}
        info = self.seal(new, parent, {"kind": "install", **record, **extra, "changed": changed})
        self.swap_sealed(new)
        self._after_swap(after_swap, new)
        return info

    def rollback(self, *, after_swap: Callable[[Record], None] | None = None) -> dict[str, Any]:
        """Swap in a new generation = current with the latest install not yet undone taken
        out (its changed paths as its parent held them); then run ``after_swap`` with that
        install's record, whose failure is logged and leaves the rollback standing.
        Returns the new record; the caller collects garbage next (:meth:`collect_garbage`)."""
        current = self.ensure()
        target = self._latest_undoable_install(current)
        parent = self.root / str(target.parent)
        if not (parent / GENERATION_FILE).exists():
            raise RegistryError(
                f"Cannot roll back {target.id}: its parent generation "
                f"{target.parent} is gone (kept: {self.keep})."
            )
        new = self.fork(current)
        for rel in target.changed:
            with contextlib.suppress(FileNotFoundError):
                (new / rel).unlink()
            if (parent / rel).exists():
                (new / rel).parent.mkdir(parents=True, exist_ok=True)
                os.link(parent / rel, new / rel)
        info = self.seal(
            new,
            current,
            {"kind": "rollback", "undoes": target.id, "bundle": target.extra.get("bundle")},
        )
        self.swap_sealed(new)
        self._after_swap(after_swap and functools.partial(after_swap, target), new)
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
                f"({gen.name} and older are gone; kept: {self.keep})."
            )
        raise RegistryError(f"Store {self.root}: no bundle install left to roll back.")

    # ---- repair --------------------------------------------------------------------

    def ensure(self) -> Path:
        """The current generation, repaired first where its link or record is broken."""
        self.repair()
        gen = linked(self.root)
        assert gen is not None  # repair leaves a link to a sealed generation
        return gen

    def repair(self) -> str:
        """Make ``current`` a link to a sealed generation, from what is on disk, never by
        starting empty while a generation holds entries. Returns what it did, or ''."""
        link = self.root / CURRENT
        gen = linked(self.root)
        fresh = not os.path.lexists(link) and not generation_dirs(self.root)
        if gen is not None:
            if read_record(gen) is not None:
                return ""
            self.reseal(gen, "its GENERATION.json was missing or unreadable")
            return f"resealed {gen.name}"
        if link.is_dir() and not link.is_symlink():  # a copy that followed the link
            adopted = self.new_dir()
            os.rename(link, adopted)
            self.reseal(adopted, "'current' was a folder, not a link")
            self.swap(adopted)
            return f"adopted the folder 'current' as {adopted.name}"
        if os.path.lexists(link) and not link.is_symlink():
            self.quarantine.move_aside(
                link, self.quarantine.path(CURRENT), "'current' was not a link"
            )
        target = fallback(self.root)
        if target is None:
            target = self.new_dir()
            self.seal(target, None, {"kind": "init"})
        elif read_record(target) is None:
            self.reseal(target, "'current' was missing or broken")
        self.swap(target)
        return "" if fresh else f"pointed 'current' at {target.name}"

    def reseal(self, gen: Path, why: str) -> None:
        """Seal a generation whose record is gone, keeping its entries and a broken record."""
        record = gen / GENERATION_FILE
        if os.path.lexists(record):
            target = self.quarantine.path(f"{gen.name}-{GENERATION_FILE}")
            self.quarantine.move_aside(record, target, why)
        older = [
            g for g in generation_dirs(self.root) if number(g) < number(gen) and read_record(g)
        ]
        log.warning("store %s: resealing %s (%s)", self.root, gen.name, why)
        self.seal(gen, older[-1] if older else None, {"kind": "repair", "reason": why})

    # ---- building blocks -----------------------------------------------------------

    def fork(self, parent: Path) -> Path:
        """A new, unsealed generation holding hard links to every entry file of ``parent``."""
        new = self.new_dir()
        for path in entry_files(parent):
            dst = new / path.relative_to(parent)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dst)
        return new

    def new_dir(self) -> Path:
        """A new, empty generation folder, numbered past every name in the root."""
        # every generation name, a stray file's too (anything else numbers -1)
        numbers = [number(self.root / name) for name in os.listdir(self.root)]
        new = self.root / f"gen-{max([0, *numbers]) + 1:06d}"
        new.mkdir(parents=True)
        return new

    def seal(self, gen: Path, parent: Path | None, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``gen``'s record (``record`` with its id, parent and time) and stamp it:
        from now on a repair may take it for the generation in use. The record."""
        info = {
            "id": gen.name,
            "parent": parent.name if parent else None,
            "created": now_iso(),
            **record,
        }
        self.touch_stamp(gen)
        self._clear_marker(gen, GENERATION_FILE)
        atomic.write_json(gen / GENERATION_FILE, info)
        return info

    def swap(self, gen: Path) -> None:
        """Point ``current`` at ``gen`` with one rename."""
        atomic.replace_symlink(self.root / CURRENT, gen.name)
        log.info("store %s: current generation is now %s", self.root, gen.name)

    def swap_sealed(self, gen: Path) -> None:
        """Swap in a new generation; if the swap fails (a full disk), unseal it, so that no
        repair ever mistakes it for the generation in use."""
        try:
            self.swap(gen)
        except BaseException:
            with contextlib.suppress(OSError):
                (gen / GENERATION_FILE).unlink()
            raise

    def touch_stamp(self, gen: Path) -> None:
        """Replace ``gen``'s ``.stamp``: readers see that it changed and reload."""
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
        target = self.quarantine.path(f"{gen.name}-{name}")
        self.quarantine.set_aside(path, target, f"{kind} where the marker {name} belongs")
        log.error("store %s: %s where %s belongs -> %s", self.root, kind, path, target)

    # ---- garbage collection --------------------------------------------------------

    def collect_garbage(self) -> dict[str, list[str]]:
        """Drop generations nobody needs (:class:`~registry.storage.garbage.GarbageCollector`):
        what it did."""
        return self.collector.collect()

    def collect_garbage_until(self, deadline: float) -> tuple[dict[str, list[str]], bool]:
        """Drop generations nobody needs until ``deadline`` (``time.monotonic``): what it
        did, and whether it looked at them all; the next call goes on where it stopped."""
        return self.collector.collect_until(deadline)
