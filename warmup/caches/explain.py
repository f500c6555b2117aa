"""The predictions of ``explain`` (``triton-warmup explain``, and the init container
before it warms): for each cache family, whether this host hits what the volume, the
bundles and the remote tier hold, and the factor that makes a miss; this host's side of
the comparison (its fingerprint, Triton's origin, the kernels' source hashes)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from kernels import ADAPTERS, adapter_for
from registry import families as registry_families
from registry.bundles import bundle
from registry.caches.triton_cache import Origin
from registry.core.errors import RegistryError
from registry.core.explain import Prediction
from registry.core.fingerprint import Fingerprint, cpu_fingerprint, detect
from registry.core.volume import Volume
from registry.families import Host, Sources
from registry.remote.tier import RemoteTier
from registry.trust.signing import Trust
from warmup.caches import families
from warmup.core.manifest import Manifest
from warmup.core.results import RankHost
from warmup.core.services import Services
from warmup.core.settings import Settings

log = logging.getLogger(__name__)
__all__ = ["Host", "explain"]


def detect_host(settings: Settings, manifest: Manifest | None = None) -> Host:
    """This host: its GPU's fingerprint (the CPU's for ``device=cpu``), its Triton knobs,
    the source hash of each adapter kernel the manifest names."""
    fingerprint = cpu_fingerprint() if settings.run.device == "cpu" else detect()
    return Host(fingerprint, Origin.of(fingerprint), kernel_hashes(manifest))


def reported_host(reported: RankHost, manifest: Manifest | None) -> Host:
    """The host rank 0 detected (``warmup.core.results.RankHost``)."""
    fingerprint = Fingerprint.from_json(reported.fingerprint).with_kernel("")
    origin = Origin.of(fingerprint, reported.triton_env)
    return Host(fingerprint, origin, kernel_hashes(manifest))


def kernel_hashes(manifest: Manifest | None) -> dict[str, str]:
    """The source hash of each adapter kernel the manifest names."""
    if manifest is None:
        return {}

    names = sorted({e.kernel for e in manifest.entries} & set(ADAPTERS))
    return {name: adapter_for(name).kernel_hash() for name in names}


def explain(
    services: Services,
    manifest: Manifest | None,
    host: Host,
    *,
    remote: RemoteTier | None,
    local: bool = True,
) -> list[Prediction]:
    """One prediction per cache family (``registry.families``), in their order.
    ``local``: also what this pod's own cache folders hold (not while a run restores and
    compiles into them)."""
    bundles = _pending_bundles(services.settings.paths.bundle_dir, services.trust)
    sources = Sources(bundles, remote, local)
    return families.explain(families.scope(services, manifest), host, sources)


def _pending_bundles(folder: Path, trust: Trust) -> list[bundle.Bundle]:
    """The bundles waiting in the bundle folder, verified as the sidecar will install
    them (one that is bad, or that ``trust`` refuses, is skipped: it will not install)."""
    found = []
    for path in sorted({*folder.glob("*.tgz"), *folder.glob("*.tar.gz")}):
        try:
            found.append(bundle.verify(path, trust=trust))
        except (OSError, RegistryError) as e:
            log.warning("explain: skipping bundle %s: %s", path.name, e)
    return found


def volume_problem(volume: Path) -> str:
    """What makes ``volume`` read as empty though it may be a mistyped path: "" when it
    holds any of a volume's folders."""
    fix = "every family reads as empty; check --volume (TRITON_WARMUP_VOLUME)"
    if not volume.exists():
        return f"volume '{volume}' does not exist: {fix}"
    if not volume.is_dir():
        return f"volume '{volume}' is not a folder: {fix}"
    paths = Volume(volume)
    roots = (family.volume_root(paths) for family in registry_families.every())
    held = (paths.registry, *(root for root in roots if root is not None), paths.bundles)
    if any(folder.is_dir() for folder in held):
        return ""
    names = ", ".join(f"{folder.name}/" for folder in held)
    return f"volume '{volume}' holds none of {names} (not a volume, or nothing stored yet): {fix}"


def log_predictions(predictions: Iterable[Prediction]) -> None:
    for prediction in predictions:
        log.info("explain: %s", prediction.line())


class Background:
    """``explain`` on a thread of the init container's launcher while the ranks warm,
    once the volume is restored, with the host rank 0 reports (``RankHost`` in
    ``run_dir``), from what the volume, bundles and remote tier hold: its lines logged, its
    predictions kept for the run's metrics. A failure is logged and predicts nothing;
    it never fails the run."""

    def __init__(self, services: Services, manifest: Manifest, run_dir: Path) -> None:
        self.predictions: list[Prediction] = []
        self._ranks_ended = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(services, manifest, run_dir), name="explain", daemon=True
        )
        self._thread.start()

    def _run(self, services: Services, manifest: Manifest, run_dir: Path) -> None:
        try:
            wait_s = services.settings.run.rank_timeout_s
            reported = RankHost.wait(run_dir, wait_s, self._ranks_ended)
            if reported is None:
                log.warning("explain: rank 0 reported no host facts; nothing predicted")
                return
            host = reported_host(reported, manifest)
            remote = services.remote
            self.predictions = explain(services, manifest, host, remote=remote, local=False)
            log_predictions(self.predictions)
        except Exception as e:
            log.warning("explain failed, nothing predicted: %s: %s", type(e).__name__, e)

    def result(self, timeout_s: float = 30.0) -> list[Prediction]:
        """The predictions, once made (the ranks have ended: rank 0 reported its host
        or never will; waiting at most ``timeout_s`` for the comparison itself)."""
        self._ranks_ended.set()
        self._thread.join(timeout_s)
        return list(self.predictions)
