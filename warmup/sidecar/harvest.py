"""Harvest after ready: what the server compiles under traffic is kept for the fleet.

The sidecar watches the server's caches with watchdog (files created or renamed into
place; nothing polls: :mod:`~warmup.sidecar.harvest_watch`). It takes only finished
entries, and the cache families (``registry.families``) say which:

- the files a family takes one by one, as each is finished (Triton's kernels when their
  group file appears, autotune results, launcher stubs: each family's module says
  which and checks them);
- each family's watched folders (the Inductor cache, each folder a manifest declares
  under ``caches:``) as a whole, once they have been quiet for ``INDUCTOR_QUIET_S``:
  each family saves every declared thing again from them (``Family.harvest``), so its
  index lists what traffic compiled too (:mod:`~warmup.sidecar.harvest_families`).

Each entry is checked before anything is written. It must be inside its folder, be
regular files (no links), be under the size caps, and have been compiled for this pod's
GPU and Triton (the run's fingerprint, from the status file:
:mod:`~warmup.sidecar.harvest_host`). It is then copied into the volume's families,
where every pod started later restores it, and published to the remote tier,
content-addressed, so N pods harvesting one kernel store it once
(:mod:`~warmup.sidecar.harvest_publish`).

An entry that fails a check is refused, with one log line and the metric
``triton_warmup_harvest_entries_total{result="refused"}``, and nothing is written. A
burst past ``TRITON_WARMUP_HARVEST_MAX_PER_MINUTE`` waits in a bounded queue; past the
queue, entries are dropped and counted (:mod:`~warmup.sidecar.harvest_queue`). Nothing
is harvested before the pod is ready: the init container's own work is saved by its
run. The harvest runs in the sidecar's threads and never touches the server's process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry.families.file_harvest import FileLimits
from registry.remote.tier import RemoteTier
from registry.storage.store import Store
from warmup.core.metrics import ServeMetrics
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.sidecar.harvest_families import FamilyHarvest
from warmup.sidecar.harvest_host import host_of
from warmup.sidecar.harvest_publish import Publisher
from warmup.sidecar.harvest_queue import FOLDERS, HarvestQueue
from warmup.sidecar.harvest_watch import HarvestWatch

__all__ = ["FOLDERS", "Harvester", "Limits"]
log = logging.getLogger(__name__)
NICENESS = 19  # the harvest thread's: the lowest CPU priority
READY_CHECK_S = 1.0  # the status is read at most this often before the pod is ready


@dataclass(frozen=True)
class Limits:
    """The harvest's bounds: a file, an entry's files together, entries a minute, and
    entries waiting."""

    max_file_bytes: int = FileLimits.max_file_bytes
    max_entry_bytes: int = FileLimits.max_entry_bytes
    max_per_minute: int = 600
    max_pending: int = 10_000

    @property
    def files(self) -> FileLimits:
        return FileLimits(self.max_file_bytes, self.max_entry_bytes)


class Harvester:
    """Watch the server's caches and publish what it compiles; see the module's docstring.
    ``status``: how the pod's status is read (the status file's by default); ``store``:
    the registry harvested entries go to (the sidecar's own, which cleared the debris at
    start; else one opened at the first use)."""

    def __init__(
        self,
        services: Services,
        metrics: ServeMetrics,
        *,
        remote: RemoteTier | None = None,
        limits: Limits | None = None,
        status: Callable[[], RunStatus | None] | None = None,
        store: Store | None = None,
    ) -> None:
        self.services = services  # the sidecar's
        self.settings = settings = services.settings
        self.metrics = metrics
        self.remote = remote
        self.limits = limits or Limits(max_per_minute=settings.sidecar.harvest_max_per_minute)
        self._status = status or (lambda: RunStatus.read(settings.paths.status_file))
        self._store = store
        self.families = FamilyHarvest(
            services,
            metrics,
            publisher=Publisher(remote),
            store=self._opened_store,
            limits=self.limits.files,
        )
        self.queue = HarvestQueue(
            max_per_minute=self.limits.max_per_minute,
            max_pending=self.limits.max_pending,
            folders=settings.folders.inductor_cache_dir,
            dropped=self.families.dropped,
        )
        self.watch = HarvestWatch(self.families.kind, self.offer)
        self._worker: threading.Thread | None = None
        self.busy: deque[tuple[float, float]] = deque(maxlen=10_000)  # (start, end) of work
        self._was_ready = False
        self._ready_checked = -1.0

    @property
    def folders(self) -> list[Path]:
        """Every family's watched folders for this pod's manifest (the Inductor cache
        whatever it declares), read once."""
        return self.families.folders

    def start(self) -> None:
        # the server's metrics folder, made by the server: learned shapes also merge at
        # every save of the watched folders, so a folder not there yet loses nothing
        recursive = dict.fromkeys([*self.families.file_folders, *self.folders])
        self.watch.start(recursive, flat=[self.settings.paths.metrics_dir])
        self._worker = threading.Thread(target=self._run, daemon=True, name="harvest")
        self._worker.start()

    def stop(self, timeout: float = 1.0) -> None:
        self.queue.stop()
        self.watch.stop(timeout)
        if self._worker is not None:
            self._worker.join(timeout)

    def offer(self, kind: str, path: Path) -> None:
        """Queue an entry (the watcher's events; a test's too); dropped past the bound.
        Before the pod is ready nothing is queued: the run saves its own work."""
        if self._ready():
            self.queue.offer(kind, path)

    def harvest(self, kind: str, path: Path) -> str:
        """Check and publish one entry now; its result (harvested, deduplicated,
        refused, seen: harvested already; waiting: the pod is not ready yet)."""
        status = self._status()
        host = host_of(status, self.settings.paths.metrics_dir)
        if status is None or host is None:
            return "waiting"
        if self.families.takes_one_by_one(kind):
            return self.families.file(kind, path, host)
        return self.families.watched(status, host)  # counted by family

    # ---- readiness ----------------------------------------------------------------------

    def _ready(self) -> bool:
        """Whether the pod is ready; once it is, it stays so for this harvest (a status
        read on every event of a busy cache would cost the watcher's thread)."""
        if self._was_ready:
            return True
        now = time.monotonic()
        if now - self._ready_checked < READY_CHECK_S:
            return False
        self._ready_checked = now
        status = self._status()
        self._was_ready = host_of(status, self.settings.paths.metrics_dir) is not None
        if self._was_ready and status is not None and not status.fingerprint:
            self._catch_up()
        return self._was_ready

    def _catch_up(self) -> None:
        """The host was told by the server (its init started no rank): what the server
        compiled before this harvest knew it was dropped, so the files families take one
        by one are offered as they are now, and the watched folders' save is due."""
        for folder in self.families.file_folders:
            self.watch.offer_present(folder)
        self.offer(FOLDERS, self.settings.folders.inductor_cache_dir)

    # ---- the worker ---------------------------------------------------------------------

    def _run(self) -> None:
        _yield_the_cpu()
        while (job := self.queue.next()) is not None:
            started = time.time()
            try:
                result = self.harvest(*job)
            except Exception as e:  # never kill the harvest: the next entry goes on
                log.exception("harvest of %s failed: %s", job[1], e)
                result = "failed"
            if result not in ("waiting", "seen"):  # only work spends the rate
                self.queue.spent()
                self.busy.append((started, time.time()))

    def _opened_store(self) -> Store:
        if self._store is None:  # one: a store clears killed writers' debris once
            self._store = self.services.store()
        return self._store


def _yield_the_cpu() -> None:
    """Lower this thread's CPU priority (Linux: a niceness of its own), so that where
    the sidecar shares cores with the server, the server's threads go first."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)
