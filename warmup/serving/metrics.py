"""A serving process's metrics: its calls by how each config was chosen, and the work it
did after it declared itself warm. ``ServingMetrics.write`` puts them in a file of the
process's own, which the sidecar re-exports (``warmup.core.metrics.TextFolderCollector``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from warmup.core.metrics import MetricField, create_metrics


class ServingMetrics:
    """A serving process: its calls by how each config was chosen, and every Triton compile
    or autotune run after it declared itself warm. ``write`` puts them in a file of their
    own in the serving-metrics folder, which the sidecar re-exports at every scrape; a
    server with its own ``/metrics`` can register ``registry`` there instead."""

    calls = MetricField(
        Counter,
        "triton_warmup_serving_calls",
        "Calls of serving ops, by how the config was chosen (tuned: the call's own M "
        "bucket; nearest: the nearest bucket's; fallback: no tuned bucket for the layer).",
        ["kernel", "source", "rank"],
    )
    request_compiles = MetricField(
        Counter,
        "triton_warmup_request_compiles",
        "Triton compiles (or compile-cache loads) in a serving process after it was warm.",
        ["kernel", "rank"],
    )
    request_loads = MetricField(
        Counter,
        "triton_warmup_request_cache_loads",
        "Of the request compiles, those Triton loaded from its disk cache (a harvested "
        "or restored kernel: milliseconds, no build).",
        ["kernel", "rank"],
    )
    request_autotunes = MetricField(
        Counter,
        "triton_warmup_request_autotunes",
        "Autotune runs (benchmarks of a new key) in a serving process after it was warm.",
        ["kernel", "rank"],
    )
    model_compiles = MetricField(
        Counter,
        "triton_warmup_model_request_compiles",
        "Compiled models' work after the process was warm, by model and kind: "
        "dynamo_frames (compiles and recompiles), fxgraph_misses, inductor_compiles "
        "(graphs), kernel_compiles (Triton kernels), autotune_runs.",
        ["model", "what", "rank"],
    )
    model_primes = MetricField(
        Counter,
        "triton_warmup_model_primes",
        "Compiled models primed by the server (Serving.model), by outcome: restored "
        "(nothing compiled: the warmup's artifacts hit) or compiled (FX-graph misses, "
        "Triton compiles or autotune benchmarks while priming; the log says why).",
        ["model", "outcome", "rank"],
    )
    warmup_mismatches = MetricField(
        Counter,
        "triton_warmup_serving_warmup_mismatches",
        "Serving.model calls whose init container's status fingerprint differs from this "
        "process, by factor (torch, triton, gpu_name): its artifacts miss here.",
        ["factor", "rank"],
    )
    generation_swaps = MetricField(
        Counter,
        "triton_warmup_serving_generation_swaps",
        "Registry generations a serving op swapped in while running.",
        ["kernel", "rank"],
    )
    pending_tables = MetricField(
        Gauge,
        "triton_warmup_serving_pending_tables",
        "Serving ops holding a new table that changes an M's algorithm, waiting for "
        "Serving.sync() (a collective every rank calls at a step boundary).",
        ["kernel", "rank"],
    )

    def __init__(self, registry: CollectorRegistry | None = None, *, rank: int = 0) -> None:
        self.registry = registry or CollectorRegistry()
        self.rank = str(rank)
        create_metrics(self, self.registry)
        self.registry.register(_TritonRemoteCollector(self.rank))

    def write(self, folder: Path) -> Path:
        """Atomically replace this process's file in ``folder``; returns its path."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"serving-rank{self.rank}.prom"
        write_to_textfile(str(path), self.registry)
        return path


class _TritonRemoteCollector:
    """This process's Triton cache files on the remote tier (``warmup.triton_remote_cache``,
    loaded by Triton when ``TRITON_CACHE_MANAGER`` names it; zeros otherwise)."""

    OUTCOMES = ("hits", "misses", "published", "refused")

    def __init__(self, rank: str) -> None:
        self.rank = rank

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "triton_warmup_triton_remote_files",
            "Triton cache files on the remote tier, by outcome: hits and misses of a local "
            "miss's lookup, files published, files refused (too big, the tier down).",
            labels=["outcome", "rank"],
        )
        stats = getattr(sys.modules.get("warmup.triton_remote_cache"), "stats", None)
        for outcome in self.OUTCOMES:
            family.add_metric([outcome, self.rank], getattr(stats, outcome, 0))
        yield family
