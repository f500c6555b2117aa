"""Hot reload: a watchdog observer on the bundle folder installs new bundles.

Kubernetes swaps a ConfigMap volume by renaming its ``..data`` symlink, so the folder is
watched (not the files) and events are debounced: one scan after the burst settles. A
scan looks at every ``*.tgz`` / ``*.tar.gz`` in the folder (through the ConfigMap's
symlinks), installs those whose sha256 it has not seen, and rejects bad ones with the
previous generation left active. A periodic rescan catches events the OS dropped.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger(__name__)
PATTERNS = ("*.tgz", "*.tar.gz")
Install = Callable[[Path], str]  # returns the result: installed, rejected, deferred


class BundleWatcher(FileSystemEventHandler):
    def __init__(
        self,
        folder: Path,
        install: Install,
        *,
        debounce_s: float = 1.0,
        rescan_s: float = 30.0,
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        self.folder = folder
        self.install = install
        self.debounce_s = debounce_s
        self.rescan_s = rescan_s
        self.on_result = on_result
        self.seen: dict[str, str] = {}  # sha256 -> result
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._observer: Observer | None = None  # type: ignore[valid-type]
        self._rescanner: threading.Thread | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._observer = Observer()
        self._observer.schedule(self, str(self.folder), recursive=False)
        self._observer.daemon = True
        self._observer.start()
        self._rescanner = threading.Thread(
            target=self._rescan_loop, daemon=True, name="bundle-rescan"
        )
        self._rescanner.start()
        self.scan()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)

    def on_any_event(self, event: FileSystemEvent) -> None:
        with self._lock:  # debounce: a ConfigMap swap is a burst of events
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.debounce_s, self.scan)
            self._timer.daemon = True
            self._timer.start()

    def scan(self) -> dict[str, str]:
        """Install what is new; returns {file name: result} for the files looked at."""
        results: dict[str, str] = {}
        for path in sorted({p for pattern in PATTERNS for p in self.folder.glob(pattern)}):
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                continue  # removed or half-swapped meanwhile: the next event rescans
            if self.seen.get(digest) in ("installed", "rejected"):
                continue
            try:
                result = self.install(path)
            except Exception as e:  # never kill the watcher; the bundle counts as rejected
                log.exception("installing %s failed: %s", path, e)
                result = "rejected"
            self.seen[digest] = result
            results[path.name] = result
            log.info("bundle %s: %s", path.name, result)
            if self.on_result is not None:
                self.on_result(result)
        return results

    def _rescan_loop(self) -> None:
        while not self._stop.wait(self.rescan_s):
            self.scan()
