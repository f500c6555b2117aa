"""The sidecar's bundle installs: a bundle the watcher found in the bundle folder,
verified against this node's fingerprint and the trusted keys, installed into the store
once, and what it carries for the manifest's compiled models brought into their cache.

A bundle is deferred (tried again later) while what it needs is missing or busy: no
warmup has recorded the node's fingerprint yet, the keys cannot be read, the store is
locked or full. Only a bundle that fails its checks is rejected for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry import RegistryError, families
from registry.bundles import bundle
from registry.core.errors import BundleRejected
from registry.core.fingerprint import Fingerprint
from registry.storage.store import Store
from warmup.compiled.reload import restore_installed
from warmup.core.manifest import load_manifest
from warmup.core.metrics import ServeMetrics
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.sidecar.watcher import sha256_of

log = logging.getLogger("warmup.sidecar.server")  # the sidecar's log lines keep their logger's name


class BundleInstalls:
    """Installs bundles into ``store`` with ``services``' trust, for the fingerprint the
    last warmup recorded (``status``); counts model reloads in ``metrics``."""

    def __init__(
        self,
        services: Services,
        store: Store,
        metrics: ServeMetrics,
        *,
        status: Callable[[], RunStatus | None],
    ) -> None:
        self.services = services
        self.settings = services.settings
        self.store = store
        self.metrics = metrics
        self._status = status

    def install(self, path: Path, digest: str | None = None) -> str:
        """Verify and install one bundle; the previous generation stays on rejection.
        ``digest``: its sha256, where the caller has read it already (the watcher).
        Returns "installed", "deferred" or "rejected"."""
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

    def recover(self) -> None:
        """Clean what a killed writer left (temp files, unsealed generations, a broken
        ``current``) before the first install; a store it cannot write is served as is."""
        try:
            self.store.recover()
            bundle.remove_stale_stages(self.settings.paths.volume)  # .bundle-*, .tmp-*
        except (OSError, RegistryError) as e:
            log.warning("registry %s not recovered: %s", self.store.root, e)

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
