"""The sidecar's ``/metrics``: its own metrics, the last warmup run's file and every
serving process's file in the metrics folder, rendered once for concurrent scrapes."""

from __future__ import annotations

import threading
import time

from prometheus_client import generate_latest

from registry import RegistryError
from registry.storage.store import Store
from warmup.core.metrics import ServeMetrics, TextFileCollector, TextFolderCollector
from warmup.core.settings import Settings

SCRAPE_WAIT_S = 10.0  # a scrape waits this long for another one's rendering, then fails


class Scrapes:
    """Renders ``metrics`` (with the run's and the serving processes' files of
    ``settings``' paths registered on it) and ``store``'s gauges for ``/metrics``."""

    def __init__(self, settings: Settings, metrics: ServeMetrics, store: Store) -> None:
        self.metrics = metrics
        self.store = store
        paths = settings.paths
        metrics.registry.register(TextFileCollector(paths.run_metrics_file))
        metrics.registry.register(
            TextFolderCollector(paths.metrics_dir, exclude=[paths.run_metrics_file])
        )
        self._lock = threading.Lock()
        self._scraped: tuple[float, bytes] | None = None  # (when its rendering began, text)

    def text(self) -> bytes:
        """The metrics, rendered once for concurrent scrapes: a scrape that arrives while
        another renders waits and takes a rendering begun after it arrived (rendering
        parses every serving process's file: a scrape storm must not use every thread)."""
        asked = time.monotonic()
        if not self._lock.acquire(timeout=SCRAPE_WAIT_S):  # a hung volume: say so
            raise TimeoutError(f"another scrape has rendered for over {SCRAPE_WAIT_S:g} s")
        try:
            if self._scraped is not None and self._scraped[0] >= asked:
                return self._scraped[1]
            began = time.monotonic()
            try:
                self.metrics.registry_entries.set(len(self.store))
                self.metrics.quarantined.set(self.store.quarantined_files())
                self.metrics.record_recovered(self.store.recovered)
            except (OSError, RegistryError):
                pass
            self._scraped = began, generate_latest(self.metrics.registry)
            return self._scraped[1]
        finally:
            self._lock.release()
