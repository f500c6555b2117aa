"""Writing a store's generations: fork, seal and swap one in, install a bundle's entries,
roll an install back, repair a broken ``current`` or record, collect old generations.

A new generation is built beside the current one from hard links, sealed (its
``GENERATION.json``), then swapped in by one rename of ``current``: readers see all of it
or none of it. Everything here runs under the store's write lock
(:class:`registry.storage.write_lock.WriteLock`); :mod:`registry.storage.generations` only reads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from registry.core import atomic
from registry.core.entry import Entry, now_iso
from registry.core.errors import RegistryError
from registry.storage.entry_writer import EntryWriter
from registry.storage.generations import (
    CURRENT,
    GENERATION_FILE,
    STAMP_FILE,
    Record,
    entry_files,
    entry_paths,
    fallback,
    generation_dirs,
    linked,
    number,
    read_record,
    record_unreadable,
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
        self._garbage_cursor = -1  # the garbage collector stopped after this generation

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
        """Drop generations nobody needs (:meth:`garbage`): what it did."""
        return self.collect_garbage_until(math.inf)[0]

    def collect_garbage_until(self, deadline: float) -> tuple[dict[str, list[str]], bool]:
        """Drop generations nobody needs until ``deadline`` (``time.monotonic``): what it
        did, and whether it looked at them all; the next call goes on where it stopped."""
        done: dict[str, list[str]] = {"removed": [], "quarantined": []}
        for what, name in self.garbage(after=self._garbage_cursor):
            self._garbage_cursor = number(Path(name))  # the next call goes on after it
            if what in done:
                done[what].append(name)
            if time.monotonic() >= deadline:
                return done, False
        self._garbage_cursor = -1
        return done, True

    def garbage(self, *, after: int = -1) -> Iterator[tuple[str, str]]:
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
        keep = {current.name, *(g.name for g in sealed[-self.keep :])}
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
                target = self.quarantine.path(f"{gen.name}-never-current")
                self.quarantine.move_aside(
                    gen, target, f"a generation never swapped in, {len(lacking)} entries"
                )
                yield "quarantined", gen.name
            elif not lacking:
                shutil.rmtree(gen, ignore_errors=True)
                yield "removed", gen.name
            else:
                yield "kept", gen.name
