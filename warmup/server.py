"""``triton-warmup serve``: the sidecar. Needs no GPU and imports no torch.

    /healthz  200 while the process lives
    /readyz   200 only when the status file says this manifest's warmup completed and
              the registry loads; 503 with a JSON reason otherwise
    /metrics  the sidecar's metrics, the last warmup run's and every serving process's
              (Prometheus text; each serving process writes a file in the metrics folder)

It also watches the bundle folder and installs new bundles (``warmup.watcher``).
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from registry import RegistryError, Store, bundle
from registry.errors import BundleRejected
from registry.fingerprint import Fingerprint
from warmup.manifest import ManifestError, load_manifest
from warmup.metrics import ServeMetrics, TextFileCollector, TextFolderCollector
from warmup.results import RunStatus
from warmup.settings import Settings
from warmup.watcher import BundleWatcher

log = logging.getLogger(__name__)


class SidecarError(RuntimeError):
    """The sidecar cannot start: its port is taken, its address is not this host's."""


class Sidecar:
    def __init__(self, settings: Settings, metrics: ServeMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or ServeMetrics()
        self.metrics.registry.register(TextFileCollector(settings.metrics_path))
        self.metrics.registry.register(
            TextFolderCollector(settings.serving_metrics_path, exclude=[settings.metrics_path])
        )
        self.store = Store(settings.registry_path, check_interval=1.0)
        self.watcher = BundleWatcher(
            settings.bundles,
            self.install_bundle,
            debounce_s=settings.reload_debounce_s,
            on_result=lambda r: self.metrics.bundle_reloads.labels(r).inc(),
        )
        self._manifest: tuple[float, str] | None = None  # (mtime, digest)
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- answers -------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        try:
            digest = self._manifest_digest()
        except ManifestError as e:
            return self._not_ready("manifest is invalid", errors=e.errors)
        status = RunStatus.read(self.settings.status_path)
        if status is None:
            return self._not_ready(
                "no warmup has run yet (or its status file is unreadable)",
                status_file=str(self.settings.status_path),
            )
        if status.manifest_digest != digest:
            return self._not_ready(
                "the last warmup was for another manifest",
                expected=digest,
                found=status.manifest_digest,
            )
        if not status.ready:
            return self._not_ready(f"warmup is {status.state}", failures=status.failures[:20])
        if not status.shapes:  # a status written by hand or by an older writer
            return self._not_ready("the last warmup warmed no shape")
        try:
            self.store.refresh()
            entries = len(self.store)
        except (OSError, RegistryError) as e:
            return self._not_ready(f"registry does not load: {e}")
        self.metrics.ready.set(1)
        self.metrics.registry_entries.set(entries)
        return True, {
            "ready": True,
            "manifest": digest,
            "registry_entries": entries,
            "shapes": len(status.shapes),
        }

    def _not_ready(self, reason: str, **details: Any) -> tuple[bool, dict[str, Any]]:
        self.metrics.ready.set(0)
        return False, {"ready": False, "reason": reason, **details}

    def _manifest_digest(self) -> str:
        path = self.settings.manifest
        try:
            mtime = path.stat().st_mtime
        except OSError as e:
            raise ManifestError(str(path), [f"cannot read: {e}"]) from None
        if self._manifest is None or self._manifest[0] != mtime:  # a ConfigMap may change it
            self._manifest = (mtime, load_manifest(path).digest())
        return self._manifest[1]

    def metrics_text(self) -> bytes:
        try:
            self.store.refresh()
            self.metrics.registry_entries.set(len(self.store))
            self.metrics.quarantined.set(self.store.quarantined)
        except (OSError, RegistryError):
            pass
        return generate_latest(self.metrics.registry)

    def install_bundle(self, path: Path) -> str:
        """Verify and install one bundle; the previous generation stays on rejection."""
        status = RunStatus.read(self.settings.status_path)
        if status is None or not status.fingerprint:
            log.info("bundle %s deferred: no warmup has recorded this node's fingerprint", path)
            return "deferred"
        expect = Fingerprint.from_json(status.fingerprint)
        try:
            info = bundle.install(
                path,
                self.store,
                expect=expect,
                policy=self.settings.match_policy,
                triton_cache=self.settings.paths.triton_cache,
            )
        except (BundleRejected, RegistryError) as e:
            log.error("rejected %s: %s", path, e)
            return "rejected"
        log.info("installed %s as %s", path, info["id"])
        return "installed"

    # ---- serving -------------------------------------------------------------------

    def start(self, *, host: str | None = None, port: int | None = None) -> int:
        """Serve in a background thread and start the watcher; returns the bound port."""
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                sidecar._answer(self)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

        bind = (
            host if host is not None else self.settings.metrics_host,
            port if port is not None else self.settings.metrics_port,
        )
        try:
            self._http = ThreadingHTTPServer(bind, Handler)
        except OSError as e:
            raise SidecarError(
                f"cannot listen on {bind[0]}:{bind[1]} ({e.strerror or e}): set --port or "
                "TRITON_WARMUP_METRICS_PORT to a free port (0-65535; 0 picks one)"
            ) from None
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, daemon=True, name="sidecar-http"
        )
        self._thread.start()
        self.watcher.start()
        return int(self._http.server_address[1])

    def stop(self) -> None:
        self.watcher.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(request, HTTPStatus.OK, "application/json", b'{"alive": true}')
        elif path == "/readyz":
            ready, body = self.readiness()
            code = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
            self._send(request, code, "application/json", json.dumps(body).encode())
        elif path == "/metrics":
            self._send(request, HTTPStatus.OK, CONTENT_TYPE_LATEST, self.metrics_text())
        else:
            self._send(
                request,
                HTTPStatus.NOT_FOUND,
                "application/json",
                b'{"error": "not found: /healthz, /readyz, /metrics"}',
            )

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, code: int, kind: str, body: bytes) -> None:
        request.send_response(code)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
