"""One rank's warmup: every manifest shape made warm on this process's device.

For a shape of a kernel with an adapter (``kernels.ADAPTERS``): the adapter makes the
tune task, the tuner answers (registry hit, fallback, or a tuning in lockstep with the
other ranks); a config that was not just tuned is then compiled (from the cache),
launched once and checked against the reference. For a ``module:function``
entry the user's function is called for every shape with Triton's own autotune result
caching on, so its ``@triton.autotune`` choices land in the compile cache (and, after
the run, in the registry).
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import kernels
from registry import Store
from registry.fingerprint import Fingerprint, detect
from registry.locks import backend_from_url
from warmup.lockstep import Lockstep
from warmup.manifest import Manifest, ManifestEntry
from warmup.settings import Settings
from warmup.timing import Timer, cuda_event_timer, wall_clock_timer
from warmup.tuner import TuneError, TuneOptions, Tuner, TunerStats

log = logging.getLogger(__name__)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
Progress = Callable[[int, int, dict[str, Any]], None]


@dataclass
class RankReport:
    rank: int
    world: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per shape
    fingerprint: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("error")]


def warm_rank(
    manifest: Manifest,
    settings: Settings,
    *,
    rank: int,
    world: int,
    group: Any,
    device: torch.device,
    progress: Progress | None = None,
) -> RankReport:
    """Warm every shape of the manifest entries made for ``world`` ranks."""
    started = time.perf_counter()
    fingerprint = detect()
    store = Store(settings.registry_path, lock_timeout=settings.lock_timeout_s)
    report = RankReport(rank, world, fingerprint=fingerprint.to_json())
    entries = [e for e in manifest.entries if e.world_size == world]
    skipped = [e.kernel for e in manifest.entries if e.world_size != world]
    if skipped:
        log.warning("skipping entries made for another world size than %d: %s", world, skipped)
    total = sum(len(e.expand()) for e in entries)
    done = 0
    for entry in entries:
        warm_entry = _warm_user_function if entry.is_user_function else _warm_kernel
        for row in warm_entry(entry, settings, store, fingerprint, group=group, device=device):
            report.rows.append(row)
            done += 1
            if progress is not None:
                progress(done, total, row)
    report.seconds = time.perf_counter() - started
    return report


def _tuner(
    entry: ManifestEntry,
    settings: Settings,
    store: Store,
    fingerprint: Fingerprint,
    group: Any,
    device: torch.device,
    stats: TunerStats,
) -> Tuner:
    timer: Timer = cuda_event_timer() if device.type == "cuda" else wall_clock_timer()
    options = TuneOptions(
        policy=entry.policy,
        match=settings.match_policy,
        lock_ttl_s=settings.lock_ttl_s,
        lock_timeout_s=settings.lock_timeout_s,
        rank_timeout_s=settings.rank_timeout_s,
        cache_dir=settings.cache_dir,
        parallel_compile=device.type == "cuda",
    )
    return Tuner(
        store,
        fingerprint,
        timer=timer,
        lockstep=Lockstep(group, timeout_s=settings.rank_timeout_s),
        lock_backend=backend_from_url(settings.lock_location),
        options=options,
        stats=stats,
    )


def _warm_kernel(
    entry: ManifestEntry,
    settings: Settings,
    store: Store,
    fingerprint: Fingerprint,
    *,
    group: Any,
    device: torch.device,
):  # type: ignore[no-untyped-def]
    tasks = kernels.adapter_for(entry.kernel).tasks(
        entry.expand(), dtype=entry.dtype, group=group, device=device
    )
    tuner = _tuner(entry, settings, store, fingerprint, group, device, TunerStats())
    from_bundles = _bundle_paths(store)
    for task in tasks:
        yield _warm_task(task, tuner, from_bundles)


def _warm_task(task: Any, tuner: Tuner, from_bundles: set[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"kernel": task.kernel, "key": task.key()}
    try:
        outcome = tuner.get(task)
    except TuneError as e:
        return {**row, "source": "failed", "error": str(e)}
    source = outcome.source
    if (
        source == "registry"
        and outcome.entry is not None
        and outcome.entry.relpath().as_posix() in from_bundles
    ):
        source = "bundle"
    row.update(
        source=source,
        config=outcome.config.to_json(),
        seconds=outcome.seconds,
        benchmark_runs=outcome.benchmark_runs,
        lock_wait_s=outcome.lock_wait_s,
    )
    if outcome.source != "tuned":  # a stored config: compile (from the cache), launch, check
        started = time.perf_counter()
        try:
            error = task.verify(task.run(outcome.config))
        except Exception as e:  # the shape failed, the run goes on
            error = f"{type(e).__name__}: {e}"
        _synchronize()
        row["compile_seconds"] = time.perf_counter() - started
        if error:
            row["error"] = f"stored config {outcome.config.label()} failed its check: {error}"
    return row


def _warm_user_function(
    entry: ManifestEntry,
    settings: Settings,
    store: Store,
    fingerprint: Fingerprint,
    *,
    group: Any,
    device: torch.device,
):  # type: ignore[no-untyped-def]
    function = resolve_function(entry.kernel)
    _cache_triton_autotuning()
    for shape in entry.expand():
        row: dict[str, Any] = {"kernel": entry.kernel, "key": shape, "source": "user"}
        started = time.perf_counter()
        try:
            function(shape=dict(shape), dtype=DTYPES[entry.dtype], device=device)
            _synchronize()
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        row["seconds"] = time.perf_counter() - started
        yield row


def resolve_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function; a clear error when it is not there."""
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TuneError(f"Manifest kernel {spec!r}: cannot import {module_name}: {e}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise TuneError(f"Manifest kernel {spec!r}: {module_name} has no function {name!r}.")
    return function  # type: ignore[no-any-return]


def _cache_triton_autotuning() -> None:
    """Triton's own autotune result caching (what TRITON_CACHE_AUTOTUNING=1 turns on)."""
    try:
        from triton import knobs

        knobs.autotuning.cache = True
    except (ImportError, AttributeError):
        log.warning("this Triton has no autotuning cache knob; set TRITON_CACHE_AUTOTUNING=1")


def _bundle_paths(store: Store) -> set[str]:
    """Entry paths that some kept bundle install wrote: a hit there counts as 'bundle'."""
    return {
        path
        for g in store.generations()
        if g.get("kind") == "install"
        for path in g.get("changed", [])
    }


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def progress_printer(stream: Any = sys.stderr) -> Progress:
    """A one-line progress bar on a terminal; log lines otherwise."""
    interactive = hasattr(stream, "isatty") and stream.isatty()

    def show(done: int, total: int, row: dict[str, Any]) -> None:
        shape = " ".join(f"{k}={v}" for k, v in row["key"].items() if k in ("M", "N", "K"))
        what = f"{row['kernel']} {shape}: {row['source']}"
        if row.get("error"):
            what += " FAILED"
        if interactive:
            width = 24
            filled = int(width * done / max(total, 1))
            stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what:60.60}")
            if done == total:
                stream.write("\n")
            stream.flush()
        else:
            log.info("warmed %d/%d %s (%.2f s)", done, total, what, row.get("seconds", 0.0))

    return show
