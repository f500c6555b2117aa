"""The harvest's watcher: a watchdog observer on the server's cache folders hears files
created, closed or renamed into place (nothing polls), asks what each is, and offers
those that are something to the queue. It does no work itself: the observer's thread
only classifies and queues.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)
EVENTS: list[type[FileSystemEvent]] = [FileCreatedEvent, FileMovedEvent, FileClosedEvent]


class HarvestWatch(FileSystemEventHandler):
    """Offer each new file that ``classify`` names a kind for: ``offer(kind, path)``."""

    def __init__(
        self, classify: Callable[[Path], str | None], offer: Callable[[str, Path], None]
    ) -> None:
        self.classify = classify
        self.offer = offer
        self._observer: BaseObserver | None = None

    def start(self, recursive: Iterable[Path], flat: Iterable[Path] = ()) -> None:
        """Watch ``recursive`` (made if missing) with their subfolders, and ``flat``
        (made by someone else) alone; a folder not there is logged and not watched."""
        self._observer = Observer()
        for folder in recursive:
            with contextlib.suppress(OSError):  # a read-only mount: it is there or not
                folder.mkdir(parents=True, exist_ok=True)
            self._watch(folder, recursive=True)
        for folder in flat:
            self._watch(folder, recursive=False)
        self._observer.start()

    def stop(self, timeout: float = 1.0) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout)

    def on_any_event(self, event: FileSystemEvent) -> None:
        raw = getattr(event, "dest_path", "") or event.src_path
        path = Path(raw.decode() if isinstance(raw, bytes) else raw)
        kind = self.classify(path)
        if kind is not None:
            self.offer(kind, path)

    def offer_present(self, folder: Path) -> None:
        """Offer what ``folder`` holds now, as if each file had just appeared (what was
        written while no event could be taken)."""
        for path in files_under(folder):
            kind = self.classify(path)
            if kind is not None:
                self.offer(kind, path)

    def _watch(self, folder: Path, *, recursive: bool) -> None:
        assert self._observer is not None
        if not folder.is_dir():
            log.info("harvest: %s is not there; not watched", folder)
            return
        self._observer.schedule(self, str(folder), recursive=recursive, event_filter=EVENTS)


def files_under(folder: Path) -> Iterator[Path]:
    """Every file below ``folder``, in sorted order, no link followed; an unreadable
    folder is skipped."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            yield Path(root, name)
