"""Hot reload: a watchdog observer on the bundle folder installs new bundles.

Kubernetes swaps a ConfigMap volume by renaming its ``..data`` symlink, so the folder is
watched (not the files) and bundles are reached through its symlinks. Only events that
change the folder's entries count (created, written, moved, deleted): opening and reading
a bundle, the watcher's own reads included, never do. One worker thread runs every scan,
one at a time: a burst of events is one scan once it settles, and changes during a scan
bring exactly one more. A periodic check catches events the OS dropped. Either scans
only when the folder's signature (names, and inode, size and mtime of what each points
to) changed since the last scan began. A bundle is known by its sha256, hashed by
streaming and cached by that stat signature, so an unchanged file is never hashed twice.
Installed and rejected are final; deferred is retried at the next change of the folder
or of ``retry_on`` (the files whose change can make a deferred bundle installable).

Links: a link in the folder is followed only where it resolves to a file inside the
folder (a ConfigMap's ``b.tgz -> ..data/b.tgz``, ``..data -> ..2026_...``); any other
link (to a bundle elsewhere, to ``/etc/passwd``) is skipped with one warning and never
opened. A bundle is hashed through the file its link resolves to, opened without
following a link; the install reads it by its name in the folder, checked again just
before (a link retargeted between that check and the install's open is the one window
left, and only to a writer of the folder, who can put any bundle there anyway).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)
PATTERNS = ("*.tgz", "*.tar.gz")
# (path, the sha256 the watcher read it with) -> installed, rejected or deferred
Install = Callable[[Path, str], str]
FINAL = ("installed", "rejected")
DEFERRED = "deferred"
# What changes the folder's entries; opened and closed-without-writing are left out, or
# every read of a bundle would schedule the next scan.
CHANGES: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]
CHUNK = 2**20
DEFERRED_RETRY_S = 60.0  # a deferred bundle is tried again at least this often
Stat = tuple[int, int, int, int, int]  # device, inode, size, mtime_ns, ctime_ns
Listing = tuple[tuple[str, Stat | None], ...]  # the bundles' names and stat keys


def stat_key(path: Path) -> Stat | None:
    """What changes when a file is rewritten or replaced (through symlinks: a ConfigMap
    swap changes the inode); None when there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _key(st)


def _key(st: os.stat_result) -> Stat:
    # ctime too: a rewrite in place that restores the mtime (cp -p, rsync -t) changes it
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def sha256_of(file: BinaryIO) -> str:
    """The sha256 of an open file, read in chunks (a bundle may be large)."""
    digest = hashlib.sha256()
    while chunk := file.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


class BundleWatcher(FileSystemEventHandler):
    """Install each new bundle in ``folder`` once; see the module's docstring.

    ``debounce_s``: quiet time after an event before the scan (a burst that never settles
    is scanned every ten periods). ``check_s``: how often the folder's signature is
    compared. ``scans`` counts scans; ``seen`` maps sha256 to the last result."""

    def __init__(
        self,
        folder: Path,
        install: Install,
        *,
        debounce_s: float = 1.0,
        check_s: float = 2.0,
        retry_on: Iterable[Path] = (),
        on_result: Callable[[str], None] | None = None,
        on_scan: Callable[[], None] | None = None,
    ) -> None:
        self.folder = folder
        self.install = install
        self.debounce_s = debounce_s
        self.check_s = check_s
        self.retry_on = tuple(retry_on)
        self.on_result = on_result
        self.on_scan = on_scan
        self.seen: dict[str, str] = {}  # sha256 -> result
        self._warned: set[tuple[str, str]] = set()  # (name, target) of links skipped
        self.scans = 0
        self._digests: dict[Stat, str] = {}  # the last scan's files: stat -> sha256
        # the folder as the last scan began, and retry_on's keys if it deferred a bundle
        self._signature: tuple[Listing, object] | None = None
        self._scanned_at = time.monotonic()  # when the last scan began
        self._scan_lock = threading.Lock()
        self._wake = threading.Condition()
        self._due: float | None = None  # when the event-driven scan runs
        self._burst: float | None = None  # when its first event came
        self._stopped = False
        self._observer: BaseObserver | None = None
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        """Watch the folder; the first scan runs at once, in the background."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._observer = Observer()  # its threads are daemons
        self._observer.schedule(self, str(self.folder), recursive=False, event_filter=CHANGES)
        self._observer.start()
        self._schedule(delay=0.0)
        self._worker = threading.Thread(target=self._run, daemon=True, name="bundle-watcher")
        self._worker.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop watching, waiting at most ``timeout``; an install in progress is not
        waited for: it ends in its daemon thread (a store install is atomic, and the
        store's recovery cleans what a killed one left), and no other one starts."""
        deadline = time.monotonic() + timeout
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(max(0.0, deadline - time.monotonic()))
        if self._worker is not None and not self._scan_lock.locked():
            self._worker.join(max(0.0, deadline - time.monotonic()))

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._schedule(delay=self.debounce_s)

    def _schedule(self, *, delay: float) -> None:
        with self._wake:
            now = time.monotonic()
            self._burst = now if self._burst is None else self._burst
            self._due = min(now + delay, self._burst + 10 * delay)
            self._wake.notify()

    def _run(self) -> None:
        next_check = time.monotonic() + self.check_s
        while (job := self._next_job(next_check)) is not None:
            if job == "check":
                next_check = time.monotonic() + self.check_s
            signature = self.signature()
            if signature == self._signature:
                continue  # the last scan saw this already (an event and a check, say)
            try:
                self.scan(signature[0])
            except Exception:  # never kill the watcher: the next change scans again
                log.exception("scanning %s failed", self.folder)

    def _next_job(self, next_check: float) -> str | None:
        """Wait for the next scan ("scan") or periodic check ("check"); None once stopped."""
        with self._wake:
            while not self._stopped:
                now = time.monotonic()
                if self._due is not None and now >= self._due:
                    self._due = self._burst = None
                    return "scan"
                if now >= next_check:
                    return "check"
                until = next_check if self._due is None else min(self._due, next_check)
                self._wake.wait(until - now)
            return None

    def signature(self) -> tuple[Listing, object]:
        """Cheap: the bundles' names and stat keys; while a bundle waits, also
        ``retry_on``'s stat keys and the periods of ``DEFERRED_RETRY_S`` since the last scan
        (a store that was busy may take it now)."""
        waiting = self._signature is not None and self._signature[1] is not None
        return self._listing(), self._retry_keys() if waiting else None

    def _listing(self) -> Listing:
        return tuple((p.name, stat_key(p)) for p in self.bundles())

    def _retry_keys(self) -> object:
        # periods since the last scan began, not the clock's: a minute that ends just
        # after a bundle was deferred is no reason to try it again at once
        periods = int((time.monotonic() - self._scanned_at) // DEFERRED_RETRY_S)
        return tuple(map(stat_key, self.retry_on)), periods

    def bundles(self) -> list[Path]:
        """The folder's bundle files; hidden ones (a writer's temp files) are not, nor is
        a link that leads out of the folder (:meth:`inside`)."""
        found = {p for pattern in PATTERNS for p in self.folder.glob(pattern)}
        return sorted(p for p in found if not p.name.startswith(".") and self.inside(p))

    def inside(self, path: Path) -> Path | None:
        """The file of the folder that ``path`` (a name in it) is: itself, or what it
        resolves to where it is a link to a file inside the folder; None for a link that
        leads anywhere else, which is warned of once and never opened."""
        if not path.is_symlink():
            return path
        home, target = os.path.realpath(self.folder), os.path.realpath(path)
        if os.path.commonpath([home, target]) == home and target != home:
            return Path(target)
        if (path.name, target) not in self._warned:
            self._warned.add((path.name, target))
            log.warning(
                "bundle folder %s: %s is a link to %s, outside the folder: skipped, not read",
                self.folder,
                path.name,
                target,
            )
        return None

    def scan(self, listing: Listing | None = None) -> dict[str, str]:
        """Install what is new, one scan at a time; returns {file name: result} for the
        bundles tried (one installed or rejected before is skipped unread). ``listing``:
        the folder's, just taken (the watcher's loop has it from its check)."""
        with self._scan_lock:
            self.scans += 1
            if self.on_scan is not None:
                self.on_scan()
            listing = self._listing() if listing is None else listing  # as this scan began
            self._scanned_at = time.monotonic()
            retry = self._retry_keys()
            results = self._scan(listing)
            self._signature = listing, retry if DEFERRED in results.values() else None
            return results

    def _scan(self, listing: Listing) -> dict[str, str]:
        results: dict[str, str] = {}
        digests: dict[Stat, str] = {}
        for name, key in listing:
            if self._stopped:
                break
            path = self.folder / name
            found = self._digest(path, key)
            if found is None:
                continue  # removed or half-swapped meanwhile: the next event rescans
            key, digest = found
            new = self.seen.get(digest) not in FINAL and digest not in digests.values()
            if new and self.inside(path) is not None:  # again: a link may have moved since
                results[path.name] = self.seen[digest] = self._install(path, digest)
            digests[key] = digest
        self._digests = digests
        return results

    def _digest(self, path: Path, key: Stat | None) -> tuple[Stat, str] | None:
        if key is not None and key in self._digests:
            return key, self._digests[key]
        real = self.inside(path)
        if real is None:
            return None
        # never blocks on a fifo named *.tgz, never follows a link that moved since
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
        try:  # only regular files are bundles
            with os.fdopen(os.open(real, flags), "rb") as file:
                st = os.fstat(file.fileno())  # the file hashed, even if the name moved on
                if not stat.S_ISREG(st.st_mode):
                    return None
                return _key(st), sha256_of(file)
        except OSError:
            return None

    def _install(self, path: Path, digest: str) -> str:
        try:
            result = self.install(path, digest)
        except Exception as e:  # never kill the watcher; the bundle counts as rejected
            log.exception("installing %s failed: %s", path, e)
            result = "rejected"
        log.info("bundle %s: %s", path.name, result)
        if self.on_result is not None:
            self.on_result(result)
        return result
