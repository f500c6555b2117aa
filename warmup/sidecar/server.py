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

:class:`Sidecar` builds ``serve``'s services and starts and stops its parts; each job is
a collaborator with its own module: :class:`~warmup.sidecar.readiness.Readiness` (the
verdict of /readyz), :class:`~warmup.sidecar.scrapes.Scrapes` (/metrics) and
:class:`~warmup.sidecar.installs.BundleInstalls` (the watched folder's bundles).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client import CONTENT_TYPE_LATEST

from registry.trust.signing import announce
from warmup.core.metrics import ServeMetrics
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.sidecar.harvest import Harvester
from warmup.sidecar.installs import BundleInstalls
from warmup.sidecar.probe_server import Answer, Limits, Pool, ProbeServer, SidecarError
from warmup.sidecar.readiness import Readiness
from warmup.sidecar.scrapes import Scrapes
from warmup.sidecar.watcher import BundleWatcher

JSON = "application/json"


class Sidecar:
    """``serve``: builds its services once, answers /healthz, /readyz and /metrics on a
    :class:`ProbeServer`, and starts and stops the bundle watcher and the harvester."""

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
        self.store = self.services.store()
        self.scrapes = Scrapes(settings, self.metrics, self.store)
        self._trust = self.services.trust  # a keys folder it cannot use fails the start (exit 2)
        self.verdicts = Readiness(settings, self.metrics, self.store)
        self.installs = BundleInstalls(
            self.services, self.store, self.metrics, status=self.verdicts.status
        )
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
                status=self.verdicts.status,
                store=self.store,
            )
            if settings.sidecar.harvest
            else None
        )
        self._http: ProbeServer | None = None

    # ---- answers: each its collaborator's ------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether this pod is ready, and why (the JSON of /readyz):
        :meth:`Readiness.verdict <warmup.sidecar.readiness.Readiness.verdict>`."""
        return self.verdicts.verdict()

    def metrics_text(self) -> bytes:
        """The metrics of /metrics, rendered once for concurrent scrapes
        (:meth:`Scrapes.text <warmup.sidecar.scrapes.Scrapes.text>`)."""
        return self.scrapes.text()

    def install_bundle(self, path: Path, digest: str | None = None) -> str:
        """Verify and install one bundle; the previous generation stays on rejection
        (:meth:`BundleInstalls.install <warmup.sidecar.installs.BundleInstalls.install>`).
        ``digest``: its sha256, where the caller has read it already (the watcher)."""
        return self.installs.install(path, digest)

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
        self.metrics.record_trust(self._trust.mode)
        self.verdicts.check_manifest()
        self.installs.recover()
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
