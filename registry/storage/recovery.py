"""Clearing what killed writers left in a store: ``.tmp-*`` files of atomic writes that
never finished, unsealed generations of installs that never swapped in, a broken
``current`` link or record.

Under the write lock nobody else is writing, so all of it is debris. A writer's first
write clears it within a time budget and goes on at its next write where it stopped;
:meth:`Recovery.recover` does it on demand. ``recovered`` counts it, by kind (a metric).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.core import atomic
from registry.storage.generation_writer import GenerationWriter
from registry.storage.generations import is_real_dir
from registry.storage.quarantine import QUARANTINE
from registry.storage.write_lock import WriteLock

log = logging.getLogger("registry.storage.store")  # the store's log lines keep their logger's name


@dataclass
class Recovery:
    """Clears killed writers' debris in the store at ``root``: temp files itself, a
    broken ``current`` and unsealed generations through ``generations``. A write's share
    of the work is bounded by ``budget_s``; ``cleared`` says whether all of it is done."""

    root: Path
    lock: WriteLock
    generations: GenerationWriter
    budget_s: float = field(kw_only=True)
    recovered: dict[str, int] = field(default_factory=dict)  # what killed writers left: a metric
    cleared: bool = field(default=False, init=False)
    _debris: Iterator[Path | None] | None = field(default=None, init=False)  # the walk, resumed

    def recover(self, *, budget_s: float = math.inf) -> dict[str, Any]:
        """All of the clean-up, under the write lock, within ``budget_s`` (checked per
        folder walked and per generation), the rest left to the next write (then the
        report has ``"unfinished": True``). Returns what it did."""
        deadline = time.monotonic() + budget_s
        walk = temp_files(self.root)
        with self.lock.hold():
            report: dict[str, Any] = {"repaired": self.generations.repair()}
            report["temp_files"], walked = self._remove_temp_files(walk, deadline)
            report["generations"], collected = {"removed": [], "quarantined": []}, False
            if walked:
                report["generations"], collected = self.generations.collect_garbage_until(deadline)
        if not (walked and collected):
            report["unfinished"] = True
        self._count(report)
        if report["temp_files"] or any(report["generations"].values()) or report["repaired"]:
            log.warning("store %s recovered: %s", self.root, report)
        self.cleared = walked and collected
        self._debris = None if self.cleared else walk
        return report

    def clear_debris(self) -> None:
        """:meth:`recover`'s work for a write, under its lock, bounded by ``budget_s``:
        the walk for temp files goes on where it stopped at the next write (under the lock
        any such file is a dead writer's, whenever it was listed); generations are looked
        at afresh."""
        started = time.monotonic()
        deadline = started + self.budget_s
        report: dict[str, Any] = {"repaired": ""}
        if self._debris is None:
            report["repaired"] = self.generations.repair()
            self._debris = temp_files(self.root)
        report["temp_files"], walked = self._remove_temp_files(self._debris, deadline)
        report["generations"], collected = {}, False
        if walked:
            report["generations"], collected = self.generations.collect_garbage_until(deadline)
        self.cleared = walked and collected
        if self.cleared:
            self._debris = None
        self._count(report)
        self._log(report, time.monotonic() - started)

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

    def _count(self, report: Mapping[str, Any]) -> None:
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

    def _log(self, report: Mapping[str, Any], seconds: float) -> None:
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
            "" if self.cleared else "; the rest at the next write",
        )


def temp_files(root: Path) -> Iterator[Path | None]:
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
