"""Collecting a store's old generations: which ones nobody needs any more, dropped one
at a time so that a caller with a deadline can stop between two and go on later.

Runs under the store's write lock, after an install or a rollback
(:class:`registry.storage.generation_writer.GenerationWriter`) and in a recovery
(:class:`registry.storage.recovery.Recovery`).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from registry.storage.generations import (
    entry_paths,
    generation_dirs,
    linked,
    number,
    read_record,
    record_unreadable,
)
from registry.storage.quarantine import Quarantine


class GarbageCollector:
    """Drops the generations of the store at ``root`` that nobody needs, keeping the
    current one and the newest ``keep`` sealed ones; a crashed install that holds entries
    of its own goes to ``quarantine`` instead."""

    def __init__(self, root: Path, quarantine: Quarantine, *, keep: int) -> None:
        self.root = root
        self.quarantine = quarantine
        self.keep = keep
        self._cursor = -1  # the last call stopped after this generation

    def collect(self) -> dict[str, list[str]]:
        """Drop generations nobody needs (:meth:`garbage`): what it did."""
        return self.collect_until(math.inf)[0]

    def collect_until(self, deadline: float) -> tuple[dict[str, list[str]], bool]:
        """Drop generations nobody needs until ``deadline`` (``time.monotonic``): what it
        did, and whether it looked at them all; the next call goes on where it stopped."""
        done: dict[str, list[str]] = {"removed": [], "quarantined": []}
        for what, name in self.garbage(after=self._cursor):
            self._cursor = number(Path(name))  # the next call goes on after it
            if what in done:
                done[what].append(name)
            if time.monotonic() >= deadline:
                return done, False
        self._cursor = -1
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
