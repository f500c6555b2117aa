"""One rank's warmup: every manifest shape made warm on this process's device.

For a shape of a kernel with an adapter (``kernels.ADAPTERS``): the adapter makes the
tune task, the tuner answers (registry hit, fallback, or a tuning in lockstep with the
other ranks; a shape another pod is tuning waits until the others are done,
``warmup.tuning.sharing``); a config that was not just tuned is then compiled (from the
cache), launched once and checked against the reference. For a ``module:function``
entry the user's function is called for every shape with Triton's own autotune result
caching on, so its ``@triton.autotune`` choices land in the compile cache (and, after
the run, in the registry).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

import kernels
from kernels.adapter import torch_dtype
from kernels.task import TuneTask
from registry import KernelConfig, Store
from registry.core import triton_internals
from registry.core.errors import named
from registry.core.fingerprint import Fingerprint, detect_for
from registry.remote.tier import RemoteTier
from registry.remote.tiered import TieredStore
from warmup.compiled.progress import ModelProgress
from warmup.core.collectives import Lockstep
from warmup.core.manifest import Manifest, ManifestEntry, ModelEntry, resolve_user_function
from warmup.core.results import ModelResult, RankReport, RemoteCounts, ShapeResult
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run.phases import PhaseClock
from warmup.tuning.sharing import Job, Settled, Sharing, start_fraction, take_order
from warmup.tuning.timing import Timer, cuda_event_timer, cuda_latency_timer, wall_clock_timer
from warmup.tuning.tuner import TuneOptions, Tuner

if TYPE_CHECKING:
    from warmup.compiled.warm import Built  # imported where models are warmed: torch.compile

log = logging.getLogger(__name__)


Progress = Callable[[int, int, ShapeResult], None]


def warm_rank(
    manifest: Manifest,
    services: Services,
    *,
    rank: int,
    world: int,
    group: Any,
    device: torch.device,
    progress: Progress | None = None,
    clock: PhaseClock | None = None,
    model_progress: ModelProgress | None = None,
) -> RankReport:
    """Warm every shape of the manifest entries made for ``world`` ranks. The kernel
    entries' shapes are shared with the other pods of the fleet (``warmup.tuning.sharing``):
    the first pass over them, then the user functions, while other pods may finish the
    shapes this pod put aside, then those. The compiled models are built before any of
    it, so that one that cannot be built fails before any tuning, and warmed after the
    user functions. The report lists the shapes in manifest order. ``progress`` is told
    each kernel shape, ``model_progress`` each compiled model's steps. ``services``: the
    rank's, built by its entry point (the remote tier used on rank 0 only)."""
    started, settings = time.perf_counter(), services.settings
    clock = clock or PhaseClock()
    with clock.timing("prepare"):
        fingerprint = detect_for(device)  # the CPU's on CPU, even on a GPU machine
        local = services.store()
        store = TieredStore(local, _remote(services) if rank == 0 else None)
    report = RankReport(rank=rank, world=world, fingerprint=fingerprint.to_json())
    entries = _placed(manifest.entries_for(world))
    shapes = _Shapes(report, sum(len(placed.shapes) for placed in entries), progress)
    here = _Rank(services, rank, group, device, fingerprint, store, clock)
    lockstep = Lockstep(group, timeout_s=settings.run.rank_timeout_s)
    models = manifest.models_for(world)
    built = _build_models(here, models) if models else {}
    with clock.timing("prepare"):
        jobs, from_bundles = _kernel_setup(here, lockstep, entries)
    sharing = Sharing(lock_timeout_s=settings.locks.timeout_s)
    for settled in sharing.first_pass(clock.timed_items("setup", jobs)):
        shapes.add(_warm_settled(settled, from_bundles, clock), settled.job.place)
    _warm_user_functions(entries, device, shapes)
    if models:  # compiled models (warmup.compiled.warm): torch.compile
        report.models = _warm_models(here, models, model_progress, built)
    for settled in sharing.come_back():
        shapes.add(_warm_settled(settled, from_bundles, clock), settled.job.place)
    shapes.sort()
    return _completed(report, started, here)


@dataclasses.dataclass(frozen=True)
class _Rank:
    """What the steps of one rank's warmup share."""

    services: Services
    rank: int
    group: Any
    device: torch.device
    fingerprint: Fingerprint
    store: TieredStore  # the remote tier on rank 0 only
    clock: PhaseClock

    @property
    def settings(self) -> Settings:
        return self.services.settings


class _Shapes:
    """The report's shape results as they come: each told to ``progress``, and kept
    with its place in the manifest."""

    def __init__(self, report: RankReport, total: int, progress: Progress | None) -> None:
        self.report, self.total, self.progress = report, total, progress
        self.places: dict[int, int] = {}  # id(result) -> its place in the manifest

    def add(self, shape: ShapeResult, place: int) -> None:
        shapes = self.report.shapes
        shapes.append(shape.model_copy(update={"rank": self.report.rank}))
        self.places[id(shapes[-1])] = place
        if self.progress is not None:
            self.progress(len(shapes), self.total, shapes[-1])

    def sort(self) -> None:
        """The report's shapes in manifest order."""
        self.report.shapes.sort(key=lambda shape: self.places[id(shape)])


def _kernel_setup(
    here: _Rank, lockstep: Lockstep, entries: list[_Placed]
) -> tuple[Iterator[Job], set[str]]:
    """The kernel entries' jobs, from where this pod starts (rank 0 draws it), and the
    entry paths that bundles installed."""
    kernel_entries = [placed for placed in entries if not placed.entry.is_user_function]
    fraction = start_fraction(lockstep)
    from_bundles = _bundle_paths(here.store.local)
    services, store, device = here.services, here.store, here.device
    tuners = [
        _tuner(p.entry, services, store, here.fingerprint, lockstep, device) for p in kernel_entries
    ]
    return _kernel_jobs(kernel_entries, tuners, fraction, here.group, device), from_bundles


def _warm_user_functions(entries: list[_Placed], device: torch.device, shapes: _Shapes) -> None:
    """Every shape of the user function entries, in manifest order."""
    for entry, first, entry_shapes in entries:
        if entry.is_user_function:
            warmed = _warm_user_function(entry, entry_shapes, device=device)
            for place, shape in enumerate(warmed, first):
                shapes.add(shape, place)


def _build_models(here: _Rank, models: list[ModelEntry]) -> dict[str, Built]:
    """Each compiled model built once, before any kernel shape (a broken one is failed
    and logged now, not after the tuning); what built is kept for :func:`_warm_models`."""
    from warmup.compiled.warm import build_models  # compiled models only when declared

    with here.clock.timing("models"):
        return build_models(models, here.services, group=here.group, device=here.device)


def _warm_models(
    here: _Rank,
    models: list[ModelEntry],
    progress: ModelProgress | None,
    built: dict[str, Built],
) -> list[ModelResult]:
    """The manifest's compiled models, as :func:`_build_models` left them, each logged,
    their steps told to ``progress``."""
    from warmup.compiled.warm import warm_models  # compiled models only when declared

    with here.clock.timing("models"):
        return [
            _logged(result)
            for result in warm_models(
                models,
                here.services,
                rank=here.rank,
                group=here.group,
                device=here.device,
                fingerprint=here.fingerprint,
                remote=here.store.remote,
                progress=progress,
                built=built,
            )
        ]


def _completed(report: RankReport, started: float, here: _Rank) -> RankReport:
    """The report with this rank's time, its phases and its remote tier's calls (what an
    outage held back sent first)."""
    report.seconds = time.perf_counter() - started
    report.phases = dict(here.clock.seconds)
    remote = here.store.remote
    if remote is not None:
        remote.flush()  # what an outage held back
        report.remote = RemoteCounts.model_validate(dataclasses.asdict(remote.stats))
    return report


def _logged(result: ModelResult) -> ModelResult:
    (log.error if result.failed else log.info)("%s", result.describe())
    return result


def _remote(services: Services) -> RemoteTier | None:
    """The registry's remote tier, if set; one that cannot be made (checked before the
    run, so an environment that differs here) leaves the local tier alone."""
    return services.remote_or_none("registry remote tier not used")


class _Placed(NamedTuple):
    """A manifest entry, its shapes (expanded once per rank), and the manifest place of
    the first of them."""

    entry: ManifestEntry
    first: int
    shapes: list[dict[str, int]]


def _placed(entries: list[ManifestEntry]) -> list[_Placed]:
    """Each entry with its shapes and the manifest place of its first."""
    placed, first = [], 0
    for entry in entries:
        placed.append(_Placed(entry, first, entry.expand()))
        first += len(placed[-1].shapes)
    return placed


def _kernel_jobs(
    entries: list[_Placed],
    tuners: list[Tuner],
    fraction: float,
    group: Any,
    device: torch.device,
) -> Iterator[Job]:
    """The entries' shapes as jobs, the costliest first across all entries: each
    entry's own in its pod order (:func:`take_order`), equal costs in the entries'
    order. A job's task (its workspace and inputs) is made when the first pass reaches
    it, by its entry's ``tasks``, which see the entry's shapes in that entry's order.
    Every rank plans the same order from the same costs, so their collectives match."""
    adapters = [kernels.adapter_for(placed.entry.kernel) for placed in entries]
    planned: list[tuple[float, int, int]] = []  # (cost, entry, place), costliest first
    shapes: list[list[dict[str, int]]] = []  # each entry's, in the order its jobs come
    for i, (_, first, entry_shapes) in enumerate(entries):
        estimate = adapters[i].tuning_cost
        costed = [(estimate(s), place, s) for place, s in enumerate(entry_shapes, first)]
        order = take_order(costed, fraction, cost=lambda item: item[0])
        planned += [(c, i, place) for c, place, _ in order]
        shapes.append([shape for _, _, shape in order])
    planned.sort(key=lambda job: -job[0])  # stable: equal costs keep the entries' order
    streams = [  # generators: nothing is made before the first next()
        adapter.tasks(shapes[i], dtype=entry.dtype, group=group, device=device)
        for i, (adapter, (entry, _, _)) in enumerate(zip(adapters, entries, strict=True))
    ]
    for cost, i, place in planned:
        yield Job(next(streams[i]), tuners[i], place=place, cost=cost)


def _tuner(
    entry: ManifestEntry,
    services: Services,
    store: TieredStore,
    fingerprint: Fingerprint,
    lockstep: Lockstep,
    device: torch.device,
) -> Tuner:
    timer: Timer = cuda_event_timer() if device.type == "cuda" else wall_clock_timer()
    settings = services.settings
    options = TuneOptions(
        policy=entry.policy,
        match=settings.run.match_policy,
        lock_ttl_s=settings.locks.ttl_s,
        lock_timeout_s=settings.locks.timeout_s,
        lock_outage_s=settings.locks.outage_s,
        rank_timeout_s=settings.run.rank_timeout_s,
        cache_dir=settings.folders.triton_cache_dir,
        parallel_compile=device.type == "cuda",
        compile_workers=settings.run.compile_workers,
    )
    return Tuner(
        store,
        fingerprint,
        timer=timer,
        latency_timer=cuda_latency_timer() if device.type == "cuda" else None,
        lockstep=lockstep,
        lock_backend=services.locks,
        options=options,
    )


def _warm_settled(settled: Settled, from_bundles: set[str], clock: PhaseClock) -> ShapeResult:
    """A settled job as a shape result; a config that was not just tuned is compiled
    (or loaded from the cache), launched once and checked."""
    task, outcome = settled.job.task, settled.outcome
    clock.add("lock_wait", settled.idle_s)
    if outcome is None:
        clock.add("tune", settled.seconds)  # a tuning (or a lookup) that failed
        reason = str(settled.error)
        return ShapeResult(kernel=task.kernel, key=task.key(), source="failed", error=reason)
    clock.add("lock_wait", outcome.lock_wait_s)
    if outcome.source == "tuned":
        clock.add("tune", outcome.seconds - outcome.lock_wait_s)
    else:
        clock.add("lookup", outcome.seconds - outcome.lock_wait_s)
    from_bundle = outcome.entry is not None and outcome.entry.relpath().as_posix() in from_bundles
    result = ShapeResult(
        kernel=task.kernel,
        key=task.key(),
        source="bundle" if outcome.source == "registry" and from_bundle else outcome.source,
        config=outcome.config.to_json(),
        seconds=outcome.seconds,
        benchmark_runs=outcome.benchmark_runs,
        lock_wait_s=outcome.lock_wait_s + settled.deferred_s,
        unlocked=outcome.unlocked,
    )
    if outcome.source == "tuned":  # tuning launched and checked it already
        return result
    return _checked(result, task, outcome.config, clock)


def _checked(
    result: ShapeResult, task: TuneTask, config: KernelConfig, clock: PhaseClock
) -> ShapeResult:
    """A stored config's result once it is compiled (from the cache), launched and
    checked: its seconds for that, and why it failed."""
    started = time.perf_counter()
    error: str | None = None
    try:
        with clock.timing("compile"):
            task.warmup(config)
            _synchronize()
        with clock.timing("check"):
            error = task.verify(task.run(config))
            _synchronize()
    except Exception as e:  # the shape failed, the run goes on
        error = named(e)
    return result.model_copy(
        update={
            "compile_seconds": time.perf_counter() - started,
            "error": error and f"stored config {config.label()} failed its check: {error}",
        }
    )


def _warm_user_function(
    entry: ManifestEntry, shapes: list[dict[str, int]], *, device: torch.device
) -> Iterator[ShapeResult]:
    try:
        function = resolve_user_function(entry.kernel)
    except ValueError as e:  # validated before the run: the rank's environment differs
        for shape in shapes:
            yield ShapeResult(kernel=entry.kernel, key=shape, source="failed", error=str(e))
        return
    _cache_triton_autotuning()
    element = torch_dtype(entry.dtype)
    for shape in shapes:
        started = time.perf_counter()
        error = None
        try:
            function(shape=dict(shape), dtype=element, device=device)
            _synchronize()
        except Exception as e:
            error = named(e)
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
        path for g in store.generations() if g.record.kind == "install" for path in g.record.changed
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
