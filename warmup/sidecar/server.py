"""``triton-warmup serve``: the sidecar. Needs no GPU and imports no torch.

    /healthz  200 while the process lives
    /readyz   200 only when the status file says this manifest's warmup completed and
              the registry loads; 503 with a JSON reason otherwise
    /metrics  the sidecar's metrics, the last warmup run's and every serving process's
              (Prometheus text; each serving process writes a file in the metrics folder)

It also watches the bundle folder and installs new bundles (``warmup.sidecar.watcher``),
and harvests what the server compiles after ready (``warmup.sidecar.harvest``). Its
threads are bounded whatever its clients do (``ProbeServer``); the manifest is parsed at
start and again only when its file changes; an error in an answer is a 500.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from registry import RegistryError, families
from registry.bundles import bundle
from registry.core.errors import BundleRejected
from registry.core.fingerprint import Fingerprint
from registry.trust.signing import announce
from warmup.compiled.reload import restore_installed
from warmup.core.manifest import ManifestError, load_manifest
from warmup.core.metrics import ServeMetrics, TextFileCollector, TextFolderCollector
from warmup.core.results import RunStatus, ServerWarm
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.sidecar.harvest import Harvester
from warmup.sidecar.probe_server import Answer, Limits, Pool, ProbeServer, SidecarError
from warmup.sidecar.watcher import BundleWatcher, Stat, sha256_of, stat_key

log = logging.getLogger(__name__)
JSON = "application/json"
SCRAPE_WAIT_S = 10.0  # a scrape waits this long for another one's rendering, then fails


class Sidecar:
    IDLE_S = 5.0  # how long a request head may take to arrive, and an answer to be sent
    # Paths answered in threads of their own: they read files. Readiness has its own, so a
    # scrape storm never delays a probe; /healthz and 404s are answered on the loop. Scrapes
    # mostly wait for one rendering (metrics_text): threads enough to share it. A /readyz
    # flood that holds every readiness thread gets the verdict of the last second, so a
    # kubelet's probe is answered at once and never 503 for a full queue.
    POOLS: ClassVar[dict[str, Pool]] = {
        "/readyz": Pool("readiness", threads=4, reuse_s=1.0),
        "/metrics": Pool("scrapes", threads=8),
    }

    def __init__(self, settings: Settings, metrics: ServeMetrics | None = None) -> None:
        # ``serve``'s services, built once here: the sidecar is an entry point
        self.services = Services(settings, check_interval=1.0)
        self.settings = settings
        self.metrics = metrics or ServeMetrics()
        self.metrics.registry.register(TextFileCollector(settings.paths.run_metrics_file))
        self.metrics.registry.register(
            TextFolderCollector(
                settings.paths.metrics_dir, exclude=[settings.paths.run_metrics_file]
            )
        )
        self.store = self.services.store()
        self._trust = self.services.trust  # a keys folder it cannot use fails the start (exit 2)
        self.watcher = BundleWatcher(
            settings.paths.bundle_dir,
            self.install_bundle,
            debounce_s=settings.sidecar.reload_debounce_s,
            retry_on=[settings.paths.status_file],  # a warmup records the fingerprint installs need
            on_result=lambda r: self.metrics.bundle_reloads.labels(r).inc(),
            on_scan=self.metrics.bundle_scans.inc,
        )
        self.harvester = (
            Harvester(
                self.services,
                self.metrics,
                remote=self.services.remote_or_none("harvest: no remote tier"),
                status=self._status,
                store=self.store,
            )
            if settings.sidecar.harvest
            else None
        )
        self._manifest = ByStat(_manifest_digest)  # its digest or its errors
        self._status_file = ByStat(_read_status)  # a status of 32,768 results is 7 MB
        self._scrape_lock = threading.Lock()
        self._scraped: tuple[float, bytes] | None = None  # (when its rendering began, text)
        self._http: ProbeServer | None = None

    # ---- answers -------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether this pod is ready, and why (the JSON of /readyz): its manifest's warmup
        completed, by the status file, and the registry loads."""
        try:
            digest = self._manifest_digest()
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

    def _ready(self, status: RunStatus, digest: str, entries: int) -> tuple[bool, dict[str, Any]]:
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

    def _not_ready(self, reason: str, **details: Any) -> tuple[bool, dict[str, Any]]:
        self.metrics.ready.set(0)
        return False, {"ready": False, "reason": reason, **details}

    def _manifest_digest(self) -> str:
        found = self._manifest.get(self.settings.paths.manifest)[1]
        if isinstance(found, ManifestError):
            raise ManifestError(found.source, found.errors)  # a fresh one: no growing traceback
        return found

    def _status(self) -> RunStatus | None:
        return self._status_file.get(self.settings.paths.status_file)[1]

    def metrics_text(self) -> bytes:
        """The metrics, rendered once for concurrent scrapes: a scrape that arrives while
        another renders waits and takes a rendering begun after it arrived (rendering
        parses every serving process's file: a scrape storm must not use every thread)."""
        asked = time.monotonic()
        if not self._scrape_lock.acquire(timeout=SCRAPE_WAIT_S):  # a hung volume: say so
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
            self._scrape_lock.release()

    def install_bundle(self, path: Path, digest: str | None = None) -> str:
        """Verify and install one bundle; the previous generation stays on rejection.
        ``digest``: its sha256, where the caller has read it already (the watcher)."""
        status = self._status()
        if status is None or not status.fingerprint:
            log.info("bundle %s deferred: no warmup has recorded this node's fingerprint", path)
            return "deferred"
        try:
            expect = Fingerprint.from_json(status.fingerprint)
        except RegistryError as e:  # the status is at fault, not the bundle: not final
            log.warning("bundle %s deferred: the status's fingerprint is unusable: %s", path, e)
            return "deferred"
        done = self._installed_before(path, digest)
        if done is not None:
            log.info("bundle %s: installed before, as %s; not again", path, done)
            return "installed"
        try:
            trust = self.services.reload_trust()  # read again: a Secret's keys rotate in place
        except RegistryError as e:
            log.error("bundle %s deferred: the trusted keys cannot be read: %s", path, e)
            return "deferred"
        try:
            info = bundle.install(
                path,
                self.store,
                trust=trust,
                expect=expect,
                policy=self.settings.run.match_policy,
                roots=bundle.on_volume(self.settings.paths.volume),
            )
        except BundleRejected as e:
            log.error("rejected %s: %s", path, e)
            return "rejected"
        except (OSError, RegistryError) as e:  # the store's fault (a busy lock, a full disk)
            log.warning("bundle %s deferred: the store could not take it now: %s", path, e)
            return "deferred"
        log.info("installed %s as %s", path, info["id"])
        self._reload_models(expect, families.models().installed(info))
        return "installed"

    def _reload_models(self, fingerprint: Fingerprint, indexes: dict[str, Any]) -> None:
        """Bring what a bundle installed for this pod's declared models into its
        Inductor cache (``warmup.compiled.reload``); a failure costs compiles, not the
        install."""
        if not indexes:
            return
        try:
            models = load_manifest(self.settings.paths.manifest).models
            done = restore_installed(self.services, models, fingerprint, indexes)
        except Exception as e:  # the bundle is installed: this costs compiles, not it
            log.warning("compiled models not reloaded from the bundle: %s", e)
            return
        for name in done:
            self.metrics.model_reloads.labels(name).inc()

    def _installed_before(self, path: Path, digest: str | None) -> str | None:
        """The kept generation that installed these bytes already, if one did: a restarted
        sidecar neither installs a bundle twice nor undoes a rollback of it."""
        if digest is None:
            try:
                with path.open("rb") as f:
                    digest = sha256_of(f)
            except OSError:
                return None
        for g in bundle.installed(self.store):
            if g.record.kind == "install" and g.bundle.get("sha256") == digest:
                return g.record.id
        return None

    # ---- serving -------------------------------------------------------------------

    def start(self, *, host: str | None = None, port: int | None = None) -> int:
        """Serve in a background thread, read the manifest, and start the watcher;
        returns the bound port."""
        bind = (
            host if host is not None else self.settings.sidecar.host,
            port if port is not None else self.settings.sidecar.port,
        )
        try:
            self._http = ProbeServer(
                bind,
                self._route,
                pools=self.POOLS,
                limits=Limits(head_s=self.IDLE_S, write_s=self.IDLE_S),
            )
        except OSError as e:
            raise SidecarError(
                f"cannot listen on {bind[0]}:{bind[1]} ({e.strerror or e}): set --port or "
                "TRITON_WARMUP_METRICS_PORT to a free port (0-65535; 0 picks one)"
            ) from None
        self._http.start()
        announce(self._trust)
        self._check_manifest()
        self._recover_store()
        self.watcher.start()
        if self.harvester is not None:
            self.harvester.start()
        return self._http.port

    def stop(self, timeout: float = 1.0) -> None:
        """Stop accepting, stop the watcher and the server; returns within about
        ``timeout`` even while an answer or a bundle install is in progress."""
        if self._http is not None:
            self._http.shutdown(timeout / 2)
        self.watcher.stop(timeout / 2)
        if self.harvester is not None:
            self.harvester.stop(timeout / 2)

    def _recover_store(self) -> None:
        """Clean what a killed writer left (temp files, unsealed generations, a broken
        ``current``) before the first install; a store it cannot write is served as is."""
        try:
            self.store.recover()
            bundle.remove_stale_stages(self.settings.paths.volume)  # .bundle-*, .tmp-*
        except (OSError, RegistryError) as e:
            log.warning("registry %s not recovered: %s", self.store.root, e)

    def _check_manifest(self) -> None:
        """Parse the manifest now, so that a bad one is in the log at once."""
        try:
            self._manifest_digest()
        except ManifestError as e:
            for line in e.lines():
                log.error("%s", line)
            log.error("/readyz answers 503 until the manifest is fixed")

    def _route(self, path: str) -> Answer:
        """The answer to a GET of ``path``; the server answers 500 if this raises."""
        if path == "/healthz":
            return HTTPStatus.OK, JSON, b'{"alive": true}'
        if path == "/readyz":
            ready, body = self.readiness()
            code = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
            return code, JSON, json.dumps(body).encode()
        if path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, self.metrics_text()
        return HTTPStatus.NOT_FOUND, JSON, b'{"error": "not found: /healthz, /readyz, /metrics"}'


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
