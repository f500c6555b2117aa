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

import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import kernels
from kernels.adapter import torch_dtype
from registry import Store, triton_internals
from registry.fingerprint import Fingerprint, detect_for
from registry.locks import backend_from_url
from warmup.lockstep import Lockstep
from warmup.manifest import Manifest, ManifestEntry, resolve_user_function
from warmup.results import RankReport, ShapeResult
from warmup.settings import Settings
from warmup.timing import Timer, cuda_event_timer, wall_clock_timer
from warmup.tuner import TuneError, TuneOptions, Tuner

log = logging.getLogger(__name__)


Progress = Callable[[int, int, ShapeResult], None]


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
    fingerprint = detect_for(device)  # the CPU's on CPU, even on a GPU machine
    store = Store(settings.registry_path, lock_timeout=settings.lock_timeout_s)
    report = RankReport(rank=rank, world=world, fingerprint=fingerprint.to_json())
    total = manifest.shape_count(world)
    for entry in manifest.entries_for(world):
        warm_entry = _warm_user_function if entry.is_user_function else _warm_kernel
        for shape in warm_entry(entry, settings, store, fingerprint, group=group, device=device):
            report.shapes.append(shape.model_copy(update={"rank": rank}))
            if progress is not None:
                progress(len(report.shapes), total, report.shapes[-1])
    report.seconds = time.perf_counter() - started
    return report


def _tuner(
    entry: ManifestEntry,
    settings: Settings,
    store: Store,
    fingerprint: Fingerprint,
    group: Any,
    device: torch.device,
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
    )


def _warm_kernel(
    entry: ManifestEntry,
    settings: Settings,
    store: Store,
    fingerprint: Fingerprint,
    *,
    group: Any,
    device: torch.device,
) -> Iterator[ShapeResult]:
    tasks = kernels.adapter_for(entry.kernel).tasks(
        entry.expand(), dtype=entry.dtype, group=group, device=device
    )
    tuner = _tuner(entry, settings, store, fingerprint, group, device)
    from_bundles = _bundle_paths(store)
    for task in tasks:
        yield _warm_task(task, tuner, from_bundles)


def _warm_task(task: Any, tuner: Tuner, from_bundles: set[str]) -> ShapeResult:
    try:
        outcome = tuner.get(task)
    except TuneError as e:
        return ShapeResult(kernel=task.kernel, key=task.key(), source="failed", error=str(e))
    from_bundle = outcome.entry is not None and outcome.entry.relpath().as_posix() in from_bundles
    result = ShapeResult(
        kernel=task.kernel,
        key=task.key(),
        source="bundle" if outcome.source == "registry" and from_bundle else outcome.source,
        config=outcome.config.to_json(),
        seconds=outcome.seconds,
        benchmark_runs=outcome.benchmark_runs,
        lock_wait_s=outcome.lock_wait_s,
    )
    if outcome.source == "tuned":  # tuning launched and checked it already
        return result
    started = time.perf_counter()  # a stored config: compile (from the cache), launch, check
    try:
        error = task.verify(task.run(outcome.config))
    except Exception as e:  # the shape failed, the run goes on
        error = f"{type(e).__name__}: {e}"
    _synchronize()
    return result.model_copy(
        update={
            "compile_seconds": time.perf_counter() - started,
            "error": error and f"stored config {outcome.config.label()} failed its check: {error}",
        }
    )


def _warm_user_function(
    entry: ManifestEntry,
    settings: Settings,
    store: Store,
    fingerprint: Fingerprint,
    *,
    group: Any,
    device: torch.device,
) -> Iterator[ShapeResult]:
    try:
        function = resolve_user_function(entry.kernel)
    except ValueError as e:  # validated before the run: the rank's environment differs
        for shape in entry.expand():
            yield ShapeResult(kernel=entry.kernel, key=shape, source="failed", error=str(e))
        return
    _cache_triton_autotuning()
    element = torch_dtype(entry.dtype)
    for shape in entry.expand():
        started = time.perf_counter()
        error = None
        try:
            function(shape=dict(shape), dtype=element, device=device)
            _synchronize()
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        yield ShapeResult(
            kernel=entry.kernel,
            key=shape,
            source="user",
            seconds=time.perf_counter() - started,
            error=error,
        )


def _cache_triton_autotuning() -> None:
    """Triton's own autotune result caching (what TRITON_CACHE_AUTOTUNING=1 turns on)."""
    if not triton_internals.cache_autotune_results():
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
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()


def progress_printer(stream: Any = sys.stderr) -> Progress:
    """A one-line progress bar on a terminal; log lines otherwise."""
    interactive = hasattr(stream, "isatty") and stream.isatty()

    def show(done: int, total: int, shape: ShapeResult) -> None:
        what = f"{shape.describe()}: {shape.source}"
        if shape.failed:
            what += f" FAILED: {shape.error}" if shape.source != "failed" else f": {shape.error}"
        if interactive:
            width = 24
            filled = int(width * done / max(total, 1))
            stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what:60.60}")
            if done == total:
                stream.write("\n")
            stream.flush()
        else:
            log.info("warmed %d/%d %s (%.2f s)", done, total, what, shape.seconds)

    return show
