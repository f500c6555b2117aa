"""Prometheus metrics. Every metric takes a ``registry=``; tests use a fresh one.

The run's numbers come from every rank's records (rank processes write their own; the
launcher sums them) and are written as a text file beside the status file; the sidecar
serves its own metrics plus that file's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, write_to_textfile
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from registry.core import atomic
from registry.core.explain import OUTCOMES, Prediction
from registry.trust.signing import TRUST_MODES
from warmup.core.results import ModelResult, RemoteCounts, ShapeResult

SECONDS_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    900.0,
    1800.0,
)

log = logging.getLogger(__name__)
M = TypeVar("M", Counter, Gauge, Histogram)


class MetricField(Generic[M]):
    """A metric a class declares once, with its name, help and labels: each instance gets its
    own, made in that instance's registry by :func:`create_metrics`, and read as a plain
    attribute of type ``M``. ``extra`` goes to the metric as it is (``buckets=`` ...)."""

    def __init__(
        self, kind: type[M], name: str, documentation: str, labels: Sequence[str] = (), **extra: Any
    ) -> None:
        self.kind: type[M] = kind
        self.name = name
        self.documentation = documentation
        self.labels = tuple(labels)
        self.extra = extra
        self.attr = ""  # set by __set_name__

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, obj: None, owner: type) -> MetricField[M]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> M: ...
    def __get__(self, obj: object | None, owner: type) -> MetricField[M] | M:
        if obj is None:
            return self
        # only reached before create_metrics: afterwards the instance's own metric shadows this
        raise AttributeError(f"{owner.__name__}.{self.attr}: create_metrics() was not called")

    def create(self, registry: CollectorRegistry) -> M:
        return self.kind(
            self.name, self.documentation, self.labels, registry=registry, **self.extra
        )


def create_metrics(owner: object, registry: CollectorRegistry) -> None:
    """Make every :class:`MetricField` of ``owner``'s class in ``registry``, in the order the
    class declares them, as attributes of ``owner``."""
    for field in vars(type(owner)).values():
        if isinstance(field, MetricField):
            setattr(owner, field.attr, field.create(registry))


REMOTE_RESULTS = {  # label -> RemoteCounts field
    "hit": "hits",
    "miss": "misses",
    "published": "published",
    "error": "errors",
    "skipped": "skipped",
}


class RunMetrics:
    """The warmup run: tuning, compiling, cache hits and misses, locks, duration."""

    tuning_seconds = MetricField(
        Histogram,
        "triton_warmup_tuning_seconds",
        "Seconds spent tuning one shape on one rank.",
        ["kernel"],
        buckets=SECONDS_BUCKETS,
    )
    compile_seconds = MetricField(
        Histogram,
        "triton_warmup_compile_seconds",
        "Seconds of the first launch of a stored config (compile or load from the cache).",
        ["kernel"],
        buckets=SECONDS_BUCKETS,
    )
    lock_wait_seconds = MetricField(
        Histogram,
        "triton_warmup_lock_wait_seconds",
        "Seconds waited for the fleet tuning lock.",
        buckets=SECONDS_BUCKETS,
    )
    cache_hits = MetricField(
        Counter, "triton_warmup_cache_hits", "Shapes whose config was found.", ["kernel", "source"]
    )
    cache_misses = MetricField(
        Counter,
        "triton_warmup_cache_misses",
        "Shapes with no stored config (tuned now, or served a fallback).",
        ["kernel"],
    )
    configs = MetricField(
        Counter,
        "triton_warmup_configs",
        "Where each shape's config came from (registry, bundle, tuned, fallback, user).",
        ["kernel", "source"],
    )
    fallbacks = MetricField(
        Counter,
        "triton_warmup_fallbacks",
        "Shapes served a fallback config instead of a tuned one.",
        ["kernel"],
    )
    user_shapes = MetricField(
        Counter,
        "triton_warmup_user_shapes",
        "Shapes of module:function entries, warmed by calling the user's function.",
        ["kernel"],
    )
    failures = MetricField(
        Counter, "triton_warmup_failed_shapes", "Shapes that failed to warm.", ["kernel"]
    )
    duration = MetricField(
        Gauge,
        "triton_warmup_warmup_duration_seconds",
        "Seconds the last warmup run took, start to finish.",
    )
    ranks = MetricField(
        Gauge,
        "triton_warmup_ranks",
        "Ranks the warm state covers: the run's world size, whether its rank processes "
        "warmed it or a full hit restored it with none.",
    )
    rank_processes = MetricField(
        Gauge,
        "triton_warmup_rank_processes",
        "Rank processes the last run started and heard back from; 0 on a full hit.",
    )
    phase_seconds = MetricField(
        Gauge,
        "triton_warmup_phase_seconds",
        "Seconds of the last warmup run in each phase (the slowest rank's).",
        ["phase"],
    )
    run_recovered = MetricField(
        Counter,
        "triton_warmup_run_recovered",
        "What killed writers left in the registry that the last run cleared at its start, "
        "by kind: temp_files, generations_removed, generations_quarantined, repairs (the "
        "sidecar counts what it clears itself in triton_warmup_registry_recovered).",
        ["what"],
    )
    skipped_entries = MetricField(
        Gauge,
        "triton_warmup_skipped_entries",
        "Manifest entries the last run skipped because they are for another world size "
        "than the pod's (TRITON_WARMUP_OTHER_WORLD_SIZES: degraded keeps the pod ready, "
        "fail does not).",
    )
    unlocked = MetricField(
        Counter,
        "triton_warmup_unlocked_tunings",
        "Shapes tuned without the fleet lock, because its server did not answer for "
        "TRITON_WARMUP_LOCK_OUTAGE_S (another pod may have tuned them too).",
        ["kernel"],
    )
    model_seconds = MetricField(
        Gauge,
        "triton_warmup_model_warm_seconds",
        "Seconds the last run spent warming each compiled model (the slowest rank's): "
        "artifact restore, torch.compile and first calls at every shape, store.",
        ["model"],
    )
    model_ready = MetricField(
        Gauge,
        "triton_warmup_model_ready",
        "1 when every rank warmed the compiled model in the last run, else 0.",
        ["model"],
    )
    model_compiles = MetricField(
        Gauge,
        "triton_warmup_model_compiles",
        "What compiling each model cost in the last run, summed over ranks: graphs "
        "Inductor compiled (inductor_compiles) and FX graph cache hits (fxgraph_hits; "
        "restored artifacts).",
        ["model", "what"],
    )
    model_restores = MetricField(
        Counter,
        "triton_warmup_model_artifact_restores",
        "Compiled models' stored Inductor artifacts at the run's start: hit, or miss "
        "(the log and the status say why).",
        ["model", "result"],
    )
    remote_calls = MetricField(
        Counter,
        "triton_warmup_remote_tier_calls",
        "Calls to the registry's remote tier: hit, miss, published, error, skipped "
        "(not made while it was down).",
        ["result"],
    )
    cache_prediction = MetricField(
        Gauge,
        "triton_warmup_cache_prediction",
        "What explain predicted at the run's start for each cache family on this host: "
        "1 for its outcome (hit, partial, miss, empty), 0 for the others; the log "
        "names the factor of a miss.",
        ["family", "outcome"],
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        create_metrics(self, self.registry)

    def record_predictions(self, predictions: Iterable[Prediction]) -> None:
        """Each family's predicted outcome (``warmup.explain``)."""
        for prediction in predictions:
            for outcome in OUTCOMES:
                value = 1 if prediction.outcome == outcome else 0
                self.cache_prediction.labels(prediction.family, outcome).set(value)

    def record(self, shapes: Iterable[ShapeResult]) -> None:
        """Add the ranks' per-shape results."""
        for shape in shapes:
            kernel = shape.kernel
            self.configs.labels(kernel, shape.source).inc()
            if shape.failed:
                self.failures.labels(kernel).inc()
            if shape.hit:
                self.cache_hits.labels(kernel, shape.source).inc()
                if shape.compile_seconds is not None:
                    self.compile_seconds.labels(kernel).observe(shape.compile_seconds)
            elif shape.miss:
                self.cache_misses.labels(kernel).inc()
            if shape.source == "user":
                self.user_shapes.labels(kernel).inc()
            if shape.source == "tuned":
                self.tuning_seconds.labels(kernel).observe(shape.seconds)
                self.lock_wait_seconds.observe(shape.lock_wait_s)
            if shape.source == "fallback":
                self.fallbacks.labels(kernel).inc()
            if shape.unlocked and shape.rank == 0:
                self.unlocked.labels(kernel).inc()

    def record_models(self, models: Iterable[ModelResult]) -> None:
        """Add the ranks' per-model results."""
        by_name: dict[str, list[ModelResult]] = {}
        for model in models:
            by_name.setdefault(model.name, []).append(model)
        for name, ranks in by_name.items():
            self.model_seconds.labels(name).set(max(m.seconds for m in ranks))
            self.model_ready.labels(name).set(0 if any(m.failed for m in ranks) else 1)
            for what in ("inductor_compiles", "fxgraph_hits"):
                self.model_compiles.labels(name, what).set(
                    sum(m.counts.get(what, 0) for m in ranks)
                )
            for model in ranks:
                if model.restore:
                    self.model_restores.labels(name, model.restore.split(":")[0].split()[0]).inc()

    def record_run(
        self,
        ranks: int,
        duration_s: float,
        phases: Mapping[str, float],
        remote: RemoteCounts | None,
        *,
        rank_processes: int,
    ) -> None:
        """The run as a whole: the ranks it warmed for and the rank processes that
        reported (none on a full hit), its duration, phases and remote-tier calls."""
        self.ranks.set(ranks)
        self.rank_processes.set(rank_processes)
        self.duration.set(duration_s)
        for phase, seconds in phases.items():
            self.phase_seconds.labels(phase).set(seconds)
        if remote is not None:
            for result, count in REMOTE_RESULTS.items():
                self.remote_calls.labels(result).inc(getattr(remote, count))

    def record_recovered(self, counts: Mapping[str, int]) -> None:
        """What the run's start cleared of killed writers' debris, by kind."""
        for what, count in counts.items():
            if count:
                self.run_recovered.labels(what).inc(count)

    def record_skipped(self, entries: int) -> None:
        """The manifest's entries for other world sizes, which the run did not warm."""
        self.skipped_entries.set(entries)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.registry)  # atomic: temp file, then rename


class ServeMetrics:
    """The sidecar: readiness, bundle reloads and scans, registry size."""

    ready = MetricField(Gauge, "triton_warmup_ready", "1 when this manifest's warmup completed.")
    bundle_reloads = MetricField(
        Counter,
        "triton_warmup_bundle_reloads",
        "Bundles seen in the watched folder, by result.",
        ["result"],
    )
    model_reloads = MetricField(
        Counter,
        "triton_warmup_model_reloads",
        "Compiled models whose artifacts a bundle brought into the pod's Inductor cache.",
        ["model"],
    )
    harvest_entries = MetricField(
        Counter,
        "triton_warmup_harvest_entries",
        "Entries the server compiled after ready, by family (triton-kernels, "
        "triton-autotunes, inductor) and result: harvested (new on the volume), "
        "deduplicated (there already), refused (a check failed: the log says which), "
        "dropped (past the queue's bound).",
        ["family", "result"],
    )
    harvest_bytes = MetricField(
        Counter,
        "triton_warmup_harvest_bytes",
        "Bytes of the entries harvested (new on the volume), by family.",
        ["family"],
    )
    bundle_scans = MetricField(
        Counter,
        "triton_warmup_bundle_scans",
        "Scans of the watched bundle folder (each after a change; none while idle).",
    )
    registry_entries = MetricField(
        Gauge, "triton_warmup_registry_entries", "Entries in the registry's current generation."
    )
    quarantined = MetricField(
        Gauge,
        "triton_warmup_registry_quarantined",
        "Corrupt registry files moved aside since start.",
    )
    trust_mode = MetricField(
        Gauge,
        "triton_warmup_trust_mode",
        "1 for this pod's trust mode, 0 for the others: signed (trusted keys configured), "
        "code-refused (no trusted key: unsigned code refused, tuned configs taken), "
        "unsigned-allowed (TRITON_WARMUP_ALLOW_UNSIGNED=true: the opt-out).",
        ["mode"],
    )
    recovered = MetricField(
        Counter,
        "triton_warmup_registry_recovered",
        "What killed writers left in the registry that this process cleared, by kind: "
        "temp_files, generations_removed, generations_quarantined, repairs.",
        ["what"],
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        create_metrics(self, self.registry)
        self._recovered: dict[str, int] = {}  # the store's counts already added

    def record_trust(self, mode: str) -> None:
        """Set ``trust_mode``: 1 for ``mode``, 0 for every other."""
        for each in TRUST_MODES:
            self.trust_mode.labels(each).set(1 if each == mode else 0)

    def record_recovered(self, counts: Mapping[str, int]) -> None:
        """Bring ``recovered`` up to a store's running counts (``Store.recovered``)."""
        for what, total in counts.items():
            new = total - self._recovered.get(what, 0)
            if new > 0:
                self.recovered.labels(what).inc(new)
                self._recovered[what] = total


MAX_METRICS_FILE_BYTES = 16 * 2**20  # a serving process's file is a few KiB


def _read_families(path: Path) -> list[Metric]:
    """The metric families of one text-format file; none if it is missing or invalid."""
    try:
        text = atomic.read_bounded(path, MAX_METRICS_FILE_BYTES, follow_links=True).decode()
        return list(text_string_to_metric_families(text))  # parse all, then yield
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:  # unreadable, half-written or foreign: skip, keep serving
        log.debug("skipped metrics file %s: %s", path, e)
        return []


class TextFileCollector:
    """Re-export the metrics a warmup run wrote, read at every scrape."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator[Metric]:
        yield from _read_families(self.path)


class TextFolderCollector:
    """Re-export every ``*.prom`` file in a folder (the serving processes' files), read at
    every scrape, the same family in several files merged into one.

    ``write_to_textfile`` writes ``<name>.prom.<pid>.<thread>`` and renames it, so its temp
    files never match; an unreadable or invalid file is skipped; a missing folder is empty.
    ``exclude`` names files another collector already exports."""

    def __init__(self, folder: Path, *, exclude: Iterable[Path] = ()) -> None:
        self.folder = folder
        self.exclude = {p.resolve() for p in exclude}

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for path in sorted(self.folder.glob("*.prom")):
            if path.resolve() in self.exclude:
                continue
            for family in _read_families(path):
                into = merged.setdefault(family.name, family)
                if into is family:
                    continue
                if into.type != family.type:  # one name, one type: keep the first file's
                    log.debug(
                        "skipped %s in %s: %s, not %s", family.name, path, family.type, into.type
                    )
                    continue
                into.samples += family.samples
        yield from merged.values()
