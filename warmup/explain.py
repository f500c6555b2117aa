"""``triton-warmup explain``: before anything compiles, predict for each cache family
whether this host hits what the volume, the bundles and the remote tier hold, and name
the factor that makes a miss.

    triton-warmup explain           # one line per family
    triton-warmup explain --json    # the same, for machines

The families (``registry.explain.FACTORS`` lists the factors, in the order named):

tuned-configs    the registry's entries: their fingerprints under the match policy, and
                 each adapter kernel's source hash
triton-kernels   Triton's compiled kernels on the volume, in this pod's TRITON_CACHE_DIR
                 and (sampled) on the remote tier: Triton's version and build, the
                 compute capability, ptxas, the env knobs that enter Triton's key, and a
                 group file naming another folder (a cache copied without ``restore``)
triton-autotune  Triton's own autotune results (``*.autotune.json``): the same factors
inductor         each declared model's artifacts: its key (code, dims) and fingerprint

The init container runs it before it warms (``triton-warmup run``): each line is
logged, and ``triton_warmup_cache_prediction{family,outcome}`` is 1 for each family's
outcome. Outcomes: hit (everything stored is usable here), partial, miss (nothing is),
empty (nothing stored).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from registry import bundle, inductor_cache, remote_models, remote_triton, triton_cache
from registry.entry import Entry
from registry.errors import RegistryError
from registry.explain import Differences, Prediction, fingerprint_differences, predict
from registry.fingerprint import Fingerprint, MatchPolicy, cpu_fingerprint
from registry.remote import RemoteTier
from registry.signing import Trust
from registry.triton_cache import Origin
from registry.volume import Volume
from warmup.manifest import Manifest, load_manifest
from warmup.results import RankHost
from warmup.settings import Settings

log = logging.getLogger(__name__)
FAMILIES = ("tuned-configs", "triton-kernels", "triton-autotune", "inductor")


@dataclass(frozen=True)
class Host:
    """This host's side of every comparison."""

    fingerprint: Fingerprint  # no kernel hash: each kernel's comes from kernel_hashes
    triton: Origin
    kernel_hashes: Mapping[str, str] = field(default_factory=dict)  # adapter -> source hash


def detect_host(settings: Settings, manifest: Manifest | None = None) -> Host:
    """This host: its GPU's fingerprint (the CPU's for ``device=cpu``), its Triton knobs,
    the source hash of each adapter kernel the manifest names."""
    if settings.device == "cpu":
        fingerprint = cpu_fingerprint()
    else:
        from registry.fingerprint import detect

        fingerprint = detect()
    return Host(fingerprint, Origin.of(fingerprint), kernel_hashes(manifest))


def reported_host(reported: RankHost, manifest: Manifest | None) -> Host:
    """The host rank 0 detected (``warmup.results.RankHost``)."""
    fingerprint = Fingerprint.from_json(reported.fingerprint).with_kernel("")
    origin = Origin.of(fingerprint, reported.triton_env)
    return Host(fingerprint, origin, kernel_hashes(manifest))


def kernel_hashes(manifest: Manifest | None) -> dict[str, str]:
    """The source hash of each adapter kernel the manifest names."""
    if manifest is None:
        return {}
    from kernels import ADAPTERS, adapter_for

    names = sorted({e.kernel for e in manifest.entries} & set(ADAPTERS))
    return {name: adapter_for(name).kernel_hash() for name in names}


def explain(
    settings: Settings,
    manifest: Manifest | None,
    host: Host,
    *,
    remote: RemoteTier | None,
    local: bool = True,
) -> list[Prediction]:
    """One prediction per family, in :data:`FAMILIES` order. ``local``: also what this
    pod's TRITON_CACHE_DIR holds (not while a run restores and compiles into it)."""
    bundles = _pending_bundles(settings.bundle_dir, settings.trust())
    return [
        tuned_configs(settings, host, bundles, remote),
        triton_family(settings, host, "kernels", remote, local=local),
        triton_family(settings, host, "autotune", None, local=local),
        inductor(settings, manifest, host, bundles, remote),
    ]


# ---- families ---------------------------------------------------------------------------


def tuned_configs(
    settings: Settings, host: Host, bundles: list[bundle.Bundle], remote: RemoteTier | None
) -> Prediction:
    """The registry's entries, the pending bundles' and (sampled) the remote tier's."""
    found: dict[tuple[str, str, str], Entry] = {}
    sources = [settings.store().entries(), *(b.entries for b in bundles)]
    if remote is not None:
        sources.append(remote.sample())
    for entries in sources:
        for entry in entries:
            found.setdefault((entry.kernel, entry.key_json, entry.fingerprint.digest()), entry)
    held = [_entry_differences(e, host, settings.match_policy) for e in found.values()]
    return predict("tuned-configs", held, note=f"policy {settings.match_policy.value}")


def _entry_differences(entry: Entry, host: Host, policy: MatchPolicy) -> Differences:
    kernel_hash = host.kernel_hashes.get(entry.kernel, entry.fingerprint.kernel_hash)
    mine = host.fingerprint.with_kernel(kernel_hash)
    return fingerprint_differences(mine.mismatches(entry.fingerprint, policy))


def triton_family(
    settings: Settings,
    host: Host,
    kind: triton_cache.Kind,
    remote: RemoteTier | None,
    *,
    local: bool = True,
) -> Prediction:
    """Triton's kernels or autotune results: on the volume (``restore`` relocates them),
    in this pod's TRITON_CACHE_DIR (as Triton reads it), on the remote tier (sampled)."""
    volume = settings.paths.triton_cache
    recorded = triton_cache.origins(volume)  # read once: they also name a restored cache's
    held, unknown = triton_cache.held_differences(volume, host.triton, kind, known=recorded)
    if local:
        mine, mine_unknown = triton_cache.held_differences(
            settings.triton_cache_dir, host.triton, kind, restored=False, known=recorded
        )
        held.update(mine)
        unknown = (unknown - set(held)) | mine_unknown
    if remote is not None:
        for cache_key, data in remote_triton.sample_metadata(remote).items():
            try:
                factors = triton_cache.metadata_factors(data)
                held.setdefault(cache_key, triton_cache.compare(host.triton, factors))
            except ValueError:
                unknown.add(cache_key)
    note = f"{len(unknown)} of unknown origin not predicted" if unknown else ""
    family = "triton-kernels" if kind == "kernels" else "triton-autotune"
    return predict(family, held.values(), note=note)


def inductor(
    settings: Settings,
    manifest: Manifest | None,
    host: Host,
    bundles: list[bundle.Bundle],
    remote: RemoteTier | None,
) -> Prediction:
    """Each declared model: the volume's, the pending bundles' and the remote tier's
    indexes of it, against its key and this host's fingerprint."""
    if manifest is None or not manifest.models:
        return predict("inductor", [], note="no models declared")
    from warmup.compiled.key import model_key

    in_bundles = {name for b in bundles for name in b.indexes}
    held: list[Differences] = []
    missing, unreadable = 0, []
    for model in manifest.models:
        try:
            key = model_key(model).digest
        except ValueError as e:
            unreadable.append(f"{model.name}: {e}")
            continue
        relpath = inductor_cache.index_relpath(model.name, key, host.fingerprint)
        found: Differences | None = {} if relpath in in_bundles else None
        if found is None:
            found = inductor_cache.model_differences(
                settings.paths.inductor, model.name, key, host.fingerprint
            )
        if found is None and remote is not None:
            found = _remote_model(remote, model.name, key, host.fingerprint)
        if found is None:
            missing += 1
        else:
            held.append(found)
    return predict("inductor", held, missing=missing, note="; ".join(unreadable))


def _remote_model(
    remote: RemoteTier, model: str, key: str, fingerprint: Fingerprint
) -> Differences | None:
    stored = remote_models.stored_fingerprints(remote, model, key, fingerprint)
    if stored is None:
        return None
    if not stored:
        return {"model code or shapes": (key[:12], "other keys")}
    return min((fingerprint_differences(fingerprint.diff(fp)) for fp in stored), key=len)


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


# ---- the command, the log and the metric --------------------------------------------------


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], settings: Settings
) -> None:
    """Register ``explain`` on the top-level CLI."""
    parser = sub.add_parser(
        "explain", help="predict each cache family's hit or miss on this host, and why"
    )
    parser.add_argument("--manifest", type=Path, help=f"default {settings.manifest}")
    parser.add_argument("--volume", type=Path, help=f"default {settings.volume}")
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], help=f"default {settings.device}"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(settings: Settings, args: argparse.Namespace) -> int:
    """Print the predictions; 0 whatever they are (a miss is information, not an error).
    A manifest given (``--manifest``, TRITON_WARMUP_MANIFEST) must be readable
    (:class:`warmup.manifest.ManifestError`: exit 2); a volume that is no volume is
    predicted all the same, with a warning on stderr that says so."""
    manifest = _manifest(settings)
    problem = volume_problem(settings.volume)
    if problem:
        print(f"triton-warmup: warning: {problem}", file=sys.stderr)
    predictions = explain(
        settings,
        manifest,
        detect_host(settings, manifest),
        remote=settings.remote(),
    )
    if args.json:
        print(json.dumps({"predictions": [p.to_json() for p in predictions]}, indent=2))
    else:
        print("\n".join(p.line() for p in predictions))
    return 0


def _manifest(settings: Settings) -> Manifest | None:
    """The manifest; None when none was given and the default one is not there."""
    if settings.given("manifest") or settings.manifest.exists():
        return load_manifest(settings.manifest)  # a missing or unreadable one: bad input
    return None


def volume_problem(volume: Path) -> str:
    """What makes ``volume`` read as empty though it may be a mistyped path: "" when it
    holds any of a volume's folders."""
    fix = "every family reads as empty; check --volume (TRITON_WARMUP_VOLUME)"
    if not volume.exists():
        return f"volume '{volume}' does not exist: {fix}"
    if not volume.is_dir():
        return f"volume '{volume}' is not a folder: {fix}"
    paths = Volume(volume)
    held = (paths.registry, paths.triton_cache, paths.inductor, paths.bundles)
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

    def __init__(self, settings: Settings, manifest: Manifest, run_dir: Path) -> None:
        self.predictions: list[Prediction] = []
        self._ranks_ended = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(settings, manifest, run_dir), name="explain", daemon=True
        )
        self._thread.start()

    def _run(self, settings: Settings, manifest: Manifest, run_dir: Path) -> None:
        try:
            reported = RankHost.wait(run_dir, settings.rank_timeout_s, self._ranks_ended)
            if reported is None:
                log.warning("explain: rank 0 reported no host facts; nothing predicted")
                return
            host = reported_host(reported, manifest)
            remote = settings.remote()
            self.predictions = explain(settings, manifest, host, remote=remote, local=False)
            log_predictions(self.predictions)
        except Exception as e:
            log.warning("explain failed, nothing predicted: %s: %s", type(e).__name__, e)

    def result(self, timeout_s: float = 30.0) -> list[Prediction]:
        """The predictions, once made (the ranks have ended: rank 0 reported its host
        or never will; waiting at most ``timeout_s`` for the comparison itself)."""
        self._ranks_ended.set()
        self._thread.join(timeout_s)
        return list(self.predictions)
