"""The harvest's queue: what the watcher offers waits here for the worker, bounded, and
leaves at most ``max_per_minute`` a minute; a burst past the bound is dropped (and
counted by the caller). A family's watched folders are not queued one event at a time:
any event there makes one save of them due once they have been quiet for
:data:`INDUCTOR_QUIET_S`, and further events push that time back.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

FOLDERS = "folders"  # the kind of an event in a family's watched folders
INDUCTOR_QUIET_S = 5.0  # a family's watched folders are saved once quiet this long
IDLE_WAIT_S = 3600.0  # nothing queued nor due: the worker sleeps until an offer wakes it


class HarvestQueue:
    """Entries ``(kind, path)`` waiting for the worker, each once, oldest first.
    ``folders``: the path the worker is handed when the watched folders' save is due;
    ``dropped(kind)``: told of each entry dropped past ``max_pending``."""

    def __init__(
        self,
        *,
        max_per_minute: int,
        max_pending: int,
        folders: Path,
        dropped: Callable[[str], None],
    ) -> None:
        self.max_per_minute = max_per_minute
        self.max_pending = max_pending
        self.folders = folders
        self._dropped = dropped
        self._pending: OrderedDict[tuple[str, str], None] = OrderedDict()  # (kind, path)
        self._folders_due: float | None = None
        self._sent: list[float] = []  # when the last minute's entries were harvested
        self._wake = threading.Condition()
        self._stopped = False

    def offer(self, kind: str, path: Path) -> None:
        """Queue an entry, or make the folders' save due; dropped past the bound."""
        with self._wake:
            if kind == FOLDERS:
                self._folders_due = time.monotonic() + INDUCTOR_QUIET_S
            elif len(self._pending) >= self.max_pending:
                self._dropped(kind)
                return
            else:
                self._pending[(kind, str(path))] = None
            self._wake.notify()

    def next(self) -> tuple[str, Path] | None:
        """The next entry once the rate allows it (the folders once due); None once
        stopped. Blocks meanwhile."""
        with self._wake:
            while not self._stopped:
                now = time.monotonic()
                if self._pending:
                    wait = self._rate_wait(now)
                    if wait <= 0:
                        (kind, path), _ = self._pending.popitem(last=False)
                        return kind, Path(path)
                elif self._folders_due is not None and now >= self._folders_due:
                    self._folders_due = None
                    return FOLDERS, self.folders
                else:
                    wait = (self._folders_due - now) if self._folders_due else IDLE_WAIT_S
                self._wake.wait(max(wait, 0.01))
            return None

    def spent(self) -> None:
        """One entry's work is done: it counts against the minute's rate (an entry
        that did no work, seen or waiting, is not told)."""
        with self._wake:
            self._sent.append(time.monotonic())

    def stop(self) -> None:
        """Wake the worker; :meth:`next` answers None from now on."""
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def pending(self) -> list[tuple[str, str]]:
        """The entries waiting, oldest first: ``(kind, path)``."""
        with self._wake:
            return list(self._pending)

    def idle(self) -> bool:
        """Whether nothing is queued and no folders' save is due."""
        with self._wake:
            return not self._pending and self._folders_due is None

    def _rate_wait(self, now: float) -> float:
        self._sent = [t for t in self._sent if now - t < 60.0]
        if len(self._sent) < self.max_per_minute:
            return 0.0
        return 60.0 - (now - self._sent[0])
