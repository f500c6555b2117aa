"""The sidecar's readiness: the verdict of ``/readyz``, read from the manifest, the
status file the warmup wrote, the server's warm declarations and the registry.

The manifest and the status file are parsed again only when their file changes
(:class:`ByStat`): a kubelet probing every second, or a flood of probes, parses each once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from registry import RegistryError
from registry.storage.store import Store
from warmup.core.manifest import ManifestError, load_manifest
from warmup.core.metrics import ServeMetrics
from warmup.core.results import RunStatus, ServerWarm
from warmup.core.settings import Settings
from warmup.sidecar.watcher import Stat, stat_key

log = logging.getLogger("warmup.sidecar.server")  # the sidecar's log lines keep their logger's name

Verdict = tuple[bool, dict[str, Any]]  # ready, and the JSON of /readyz


class Readiness:
    """Whether this pod is ready, by ``settings``' files and ``store``; sets ``metrics``'
    ready gauge and registry entries with each verdict."""

    def __init__(self, settings: Settings, metrics: ServeMetrics, store: Store) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self._manifest = ByStat(_manifest_digest)  # its digest or its errors
        self._status_file = ByStat(_read_status)  # a status of 32,768 results is 7 MB

    def verdict(self) -> Verdict:
        """Whether this pod is ready, and why (the JSON of /readyz): its manifest's warmup
        completed, by the status file, and the registry loads."""
        try:
            digest = self.manifest_digest()
        except ManifestError as e:
            return self._not_ready("manifest is invalid", errors=e.errors)
        path = self.settings.paths.status_file
        there, status = self._status_file.get(path)  # there: its stat key
        if status is None and there is not None:
            return self._not_ready(
                "the status file is unreadable (damaged, or from an incompatible version)",
                status_file=str(path),
            )
        if status is None:
            return self._not_ready("no warmup has run yet", status_file=str(path))
        if status.manifest_digest != digest:
            return self._not_ready(
                "the last warmup was for another manifest",
                expected=digest,
                found=status.manifest_digest,
            )
        if not status.ready:
            return self._not_ready(f"warmup is {status.state}", failures=status.failures[:20])
        if not status.shapes and not status.models:  # written by hand or an older writer
            return self._not_ready("the last warmup warmed no shape")
        waiting = self._server_not_warm(digest)
        if waiting:
            return self._not_ready(waiting)
        try:
            entries = len(self.store)  # reloads when another process changed the store
        except (OSError, RegistryError) as e:
            return self._not_ready(f"registry does not load: {e}")
        return self._ready(status, digest, entries)

    def status(self) -> RunStatus | None:
        """The status file's run status; None while it is absent or unreadable."""
        return self._status_file.get(self.settings.paths.status_file)[1]

    def manifest_digest(self) -> str:
        """The manifest's digest; :class:`ManifestError` while it is invalid."""
        found = self._manifest.get(self.settings.paths.manifest)[1]
        if isinstance(found, ManifestError):
            raise ManifestError(found.source, found.errors)  # a fresh one: no growing traceback
        return found

    def check_manifest(self) -> None:
        """Parse the manifest now, so that a bad one is in the log at once."""
        try:
            self.manifest_digest()
        except ManifestError as e:
            for line in e.lines():
                log.error("%s", line)
            log.error("/readyz answers 503 until the manifest is fixed")

    def _server_not_warm(self, digest: str) -> str:
        """Why the server is not warm yet ('' when it is, or when readiness does not
        wait for it): fewer than ``ready_after_server`` of its ranks declared themselves
        warm for this manifest."""
        wanted = self.settings.sidecar.ready_after_server
        if not wanted:
            return ""
        warm = ServerWarm.read_all(self.settings.paths.metrics_dir)
        ranks = {w.rank for w in warm if w.manifest_digest == digest}
        if len(ranks) >= wanted:
            return ""
        return f"the server has not declared itself warm ({len(ranks)} of {wanted} ranks)"

    def _ready(self, status: RunStatus, digest: str, entries: int) -> Verdict:
        """The ready answer: what the warmup of manifest ``digest`` left, and the registry's
        ``entries``."""
        self.metrics.ready.set(1)
        self.metrics.registry_entries.set(entries)
        return (
            True,
            {
                "ready": True,
                "degraded": status.degraded,  # entries for other world sizes left unwarmed
                "manifest": digest,
                "registry_entries": entries,
                "shapes": len(status.shapes),
                "models": sorted({model.name for model in status.models}),
                "skipped_entries": status.skipped_entries[:20],
            },
        )

    def _not_ready(self, reason: str, **details: Any) -> Verdict:
        self.metrics.ready.set(0)
        return False, {"ready": False, "reason": reason, **details}


T = TypeVar("T")


class ByStat(Generic[T]):
    """A file parsed again only when its stat key changed (a ConfigMap swap or a run's
    replace changes the inode) or while it is absent; concurrent readers never parse at
    once: one parses, the others wait for its result."""

    def __init__(self, parse: Callable[[Path], T]) -> None:
        self._parse = parse
        self._lock = threading.Lock()
        self._held: tuple[Stat | None, T] | None = None

    def get(self, path: Path) -> tuple[Stat | None, T]:
        """(the file's stat key, None if absent; its parse)."""
        key = stat_key(path)
        with self._lock:
            if self._held is None or self._held[0] != key or key is None:
                self._held = key, self._parse(path)
            return self._held


def _read_status(path: Path) -> RunStatus | None:  # looked up per parse: patchable
    return RunStatus.read(path)


def _manifest_digest(path: Path) -> str | ManifestError:
    try:
        return load_manifest(path).digest()
    except ManifestError as e:
        return e
