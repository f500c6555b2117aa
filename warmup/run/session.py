"""One rank's warmup session: restore → barrier → warm → barrier → finish.

The one sequence every rank runs, whoever started it:

- a rank process that ``triton-warmup run`` spawned (``python -m warmup.run.session`` with
  the launcher's folder in ``TRITON_WARMUP_RANK_CHILD``): the launcher restores the
  compile cache and sums the reports, the rank waits for the first and leaves the second;
- a rank that torchrun started (the same command, no launcher): rank 0 restores and sums;
- ``warmup.warm()`` inside a server's own process: rank 0 restores and sums, and every
  rank gets the status back.

Each rank writes its typed :class:`~warmup.results.RankReport` into the run folder;
:func:`finish` reads them back into the :class:`~warmup.results.RunStatus`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from registry import RegistryError, atomic, triton_internals
from registry.errors import BadInput, named
from registry.explain import Prediction
from registry.fingerprint import Fingerprint, detect_for, detect_in_background, machine_name
from registry.locks import LockServerUnreachable, check_backend
from registry.triton_internals import cache_env
from registry.volume import MissingFolder
from warmup import families, logs
from warmup.compiled.environment import inductor_environment
from warmup.manifest import Manifest, ManifestError, load_manifest
from warmup.results import (
    RUNNING,
    ModelResult,
    RankFailure,
    RankHost,
    RankReport,
    RemoteCounts,
    RunStatus,
    ShapeResult,
)
from warmup.run.phases import PhaseClock, process_age, run_phases
from warmup.settings import Settings

log = logging.getLogger(__name__)
CHILD_FLAG = "TRITON_WARMUP_RANK_CHILD"  # set in the rank processes the launcher starts
RESTORED = "restored"  # marker file: the compile cache is in place
RECOVERY_BUDGET_S = 10.0  # the start's clearing of killed writers' debris; writes go on


class RunError(BadInput, RuntimeError):
    """The run cannot start or cannot go on: no entry for the world size, no GPU, a rank
    that cannot reach its device or the restored cache."""


@dataclass(frozen=True)
class Roles:
    """Who does the work around the ranks' own: the launcher (``False``) or rank 0."""

    restores: bool
    finishes: bool


LAUNCHED = Roles(restores=False, finishes=False)  # ``triton-warmup run`` spawned us
SELF_STARTED = Roles(restores=True, finishes=True)  # torchrun, or warm() in-process


def run_session(
    settings: Settings,
    manifest: Manifest,
    *,
    rank: int,
    world: int,
    group: Any,
    device: Any,
    run_dir: Path,
    roles: Roles,
    started: float,
    clock: PhaseClock | None = None,
) -> RunStatus | None:
    """This rank's part of the run; returns the status where this process can know it
    (rank 0 of a self-started run, or every rank when there is a group to share it).
    ``clock`` has what this rank spent before (its start, the process group)."""
    clock = clock or PhaseClock()
    with clock.timing("rank_start"):  # the kernels and triton, imported here
        from warmup.compiled.progress import model_progress_printer
        from warmup.run.runner import progress_printer, warm_rank

    recovered = _restored(settings, manifest, rank, world, group, run_dir, roles, started, clock)
    report = warm_rank(
        manifest,
        settings,
        rank=rank,
        world=world,
        group=group,
        device=device,
        progress=progress_printer() if rank == 0 else None,
        clock=clock,
        model_progress=model_progress_printer() if rank == 0 else None,
    )
    report.write(run_dir)
    _barrier(group)
    if not roles.finishes:
        return None
    status = None
    if rank == 0:
        status = _finish_or_fail(settings, manifest, run_dir, world, started, recovered)
    return _shared_status(status, group)


def _restored(
    settings: Settings,
    manifest: Manifest,
    rank: int,
    world: int,
    group: Any,
    run_dir: Path,
    roles: Roles,
    started: float,
    clock: PhaseClock,
) -> dict[str, int]:
    """Restore, then barrier: the compile cache in place (the launcher's, waited for, or
    rank 0's) before any rank warms. Returns what rank 0's recovery cleared, by kind."""
    recovered: dict[str, int] = {}  # what killed writers left: rank 0 clears and counts it
    if not roles.restores:
        with clock.timing("rendezvous"):
            wait_for_restore(run_dir, settings.run_timeout_s)
    elif rank == 0:
        clear_run_dir(run_dir)
        running(manifest, world, started).write(settings.status_file)  # not ready
        with clock.timing("restore"):
            recovered = restore(settings, manifest)
    with clock.timing("rendezvous"):
        _barrier(group)
    return recovered


def _finish_or_fail(
    settings: Settings,
    manifest: Manifest,
    run_dir: Path,
    world: int,
    started: float,
    recovered: dict[str, int],
) -> RunStatus:
    """Rank 0's :func:`finish`; a failure in it is said in a failed status."""
    try:
        return finish(settings, manifest, run_dir, world, started, recovered=recovered)
    except Exception as e:  # said in the status, and told to every rank
        return running(manifest, world, started).failed([named(e)]).write(settings.status_file)


def _shared_status(status: RunStatus | None, group: Any) -> RunStatus | None:
    """Rank 0's status, broadcast to every rank of ``group`` (none: as it is)."""
    if group is None:
        return status
    import torch.distributed as dist

    holder = [status.model_dump(mode="json") if status else None]
    dist.broadcast_object_list(holder, src=0, group=group)
    return status if status is not None else RunStatus.model_validate(holder[0])  # rank 0's own


def running(manifest: Manifest, world: int, started: float) -> RunStatus:
    """The status of a run under way: never ready."""
    return RunStatus(
        state=RUNNING,
        manifest_digest=manifest.digest(),
        started=started,
        host=machine_name(),
        world_size=world,
    )


def _barrier(group: Any) -> None:
    if group is not None:
        import torch.distributed as dist

        dist.barrier(group=group)


def restore(
    settings: Settings, manifest: Manifest | None = None, *, host: Fingerprint | None = None
) -> dict[str, int]:
    """The volume into this pod: the registry recovered first, then every cache family
    (those keyed by the host only when ``host``, its fingerprint, is known; declared
    models are restored by their own warm). Returns what the recovery cleared, by kind
    (the run's metrics count it)."""
    recovered = recover_store(settings)
    where = replace(families.scope(settings, manifest, fingerprint=host), models=())
    families.restore(where, needing_host=None if host is not None else False)
    return recovered


def recover_store(settings: Settings) -> dict[str, int]:
    """Before any rank reads the registry: clean what a killed writer left and repair a
    broken ``current``, within ``RECOVERY_BUDGET_S`` (the first write goes on with the
    rest). A store that cannot be written (a read-only mount) is read as is. Returns what
    was cleared, by kind (``Store.recovered``)."""
    store = settings.store(run=True)
    try:
        store.recover(budget_s=RECOVERY_BUDGET_S)
    except (OSError, RegistryError) as e:
        log.warning("registry %s not recovered (%s); reading it as it is", settings.registry_dir, e)
    return dict(store.recovered)


def clear_run_dir(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in [*run_dir.glob("rank-*.json"), run_dir / RESTORED, run_dir / RankHost.FILE]:
        old.unlink(missing_ok=True)


def mark_restored(run_dir: Path) -> None:
    atomic.write_bytes(run_dir / RESTORED, b"")


def wait_for_restore(run_dir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (run_dir / RESTORED).exists():
        if time.monotonic() > deadline:
            raise RunError(f"the compile cache was not restored within {timeout_s:g} s")
        time.sleep(0.01)


def finish(
    settings: Settings,
    manifest: Manifest,
    run_dir: Path,
    world: int,
    started: float,
    rank_failures: list[RankFailure] | None = None,
    errors: list[str] | None = None,
    phases: Mapping[str, float] | None = None,
    ranks_ended: float | None = None,
    predictions: Sequence[Prediction] = (),
    recovered: Mapping[str, int] | None = None,
) -> RunStatus:
    """Sum every rank's report into metrics and status; save the compile cache.
    ``phases``: what the launcher spent before the ranks' reports (``warmup.run.phases``);
    ``ranks_ended``: when the launcher saw its last rank exit (``time.time()``): the time
    from the last report to then is the ranks' ``exit`` phase.

    Ready only when every rank reported every shape of the manifest's entries for
    ``world`` ranks, none failed, and there was at least one."""
    tally = _tally(settings, manifest, run_dir, world, rank_failures, errors)
    saved = _save_caches(settings, manifest, tally.reports)
    run = _run_phases(phases, saved.seconds, ranks_ended, tally.reports)
    duration = time.time() - started
    _write_metrics(settings, tally, duration, run, predictions, recovered)
    status = _status(manifest, world, started, duration, run, tally, saved)
    return status.write(settings.status_file)


def _status(
    manifest: Manifest,
    world: int,
    started: float,
    duration: float,
    run: dict[str, float],
    tally: _Tally,
    saved: _Saved,
) -> RunStatus:
    """The finished run's status: ready only when the tally found nothing wrong."""
    return RunStatus.ended(
        ready=tally.ready,
        manifest_digest=manifest.digest(),
        world=world,
        started=started,
        duration=duration,
        fingerprint=saved.fingerprint,
        triton_env=saved.triton_env,
        errors=tally.errors,
        rank_failures=[tally.failures[r] for r in sorted(tally.failures)],
        skipped_entries=tally.skipped,
        benchmark_runs=sum(s.benchmark_runs for s in tally.shapes),
        saved_artifacts=saved.copied,
        imported_entries=saved.imported,
        phases=run,
        remote=tally.remote,
        shapes=tally.shapes,
        models=tally.models,
    )


@dataclass(frozen=True)
class _Tally:
    """The ranks' reports read back, and every way the run fell short."""

    reports: list[RankReport]
    errors: list[str]
    failures: dict[int, RankFailure]  # one per rank: the first cause
    skipped: list[str]  # the manifest's entries for other world sizes
    shapes: list[ShapeResult]
    models: list[ModelResult]  # by model, then rank
    remote: RemoteCounts | None  # the remote tier's calls, summed

    @property
    def ready(self) -> bool:
        """No error, no failed rank, no failed shape or model."""
        return (
            not self.errors
            and not self.failures
            and not any(s.failed for s in self.shapes)
            and not any(m.failed for m in self.models)
        )


def _tally(
    settings: Settings,
    manifest: Manifest,
    run_dir: Path,
    world: int,
    rank_failures: list[RankFailure] | None,
    errors: list[str] | None,
) -> _Tally:
    """Every rank's report in ``run_dir``, checked against the manifest's entries for
    ``world`` ranks; a rank without one failed silently."""
    errors = list(errors or [])
    try:
        reports = RankReport.read_all(run_dir)
    except (OSError, ValueError) as e:
        reports, errors = [], [*errors, f"a rank report is unreadable: {e}"]
    failures = {f.rank: f for f in rank_failures or []}
    for rank in sorted(set(range(world)) - {r.rank for r in reports}):
        failures.setdefault(rank, RankFailure(rank=rank, end="silent"))
    errors += _shortfalls(settings, manifest, world, reports)
    models = (model for report in reports for model in report.models)
    return _Tally(
        reports=reports,
        errors=errors,
        failures=failures,
        skipped=manifest.skipped_entries(world),
        shapes=[shape for report in reports for shape in report.shapes],
        models=sorted(models, key=lambda m: (m.name, m.rank)),
        remote=_remote_counts(reports),
    )


def _shortfalls(
    settings: Settings, manifest: Manifest, world: int, reports: list[RankReport]
) -> list[str]:
    """What the manifest asked of ``world`` ranks and the reports do not give."""
    errors = []
    expected = manifest.shape_count(world)
    models_expected = len(manifest.models_for(world))
    if expected + models_expected == 0:
        errors.append(manifest.no_entry_message(world))
    refused = other_worlds_refused(settings, manifest, world)
    if refused:  # a backstop: the launcher and prepare() refuse it before any rank
        errors.append(refused)
    for report in reports:
        if len(report.shapes) != expected:
            errors.append(f"rank {report.rank} reported {len(report.shapes)} of {expected} shapes")
        if len(report.models) != models_expected:
            errors.append(
                f"rank {report.rank} reported {len(report.models)} of {models_expected} models"
            )
    return errors


@dataclass(frozen=True)
class _Saved:
    """What saving the compile cache and importing Triton's autotune choices did."""

    fingerprint: dict[str, Any] | None  # the first rank's
    triton_env: dict[str, str]
    copied: int
    imported: int
    seconds: float


def _save_caches(settings: Settings, manifest: Manifest, reports: list[RankReport]) -> _Saved:
    """Every cache family onto the volume, once the families keyed by the host (now
    known: the first rank's fingerprint) are restored for the server."""
    saving = time.perf_counter()
    fingerprint = reports[0].fingerprint if reports else None
    host = Fingerprint.from_json(fingerprint) if fingerprint else None
    where = replace(families.scope(settings, manifest, fingerprint=host), models=())
    if host is not None:
        families.restore(where, needing_host=True)
    saved = families.save(where)
    return _Saved(
        fingerprint=fingerprint,
        triton_env=cache_env() if host is not None else {},
        copied=sum(moved.copied for moved in saved),
        imported=sum(moved.entries for moved in saved),
        seconds=time.perf_counter() - saving,
    )


def _run_phases(
    phases: Mapping[str, float] | None,
    save_s: float,
    ranks_ended: float | None,
    reports: list[RankReport],
) -> dict[str, float]:
    """The run's phases: the launcher's, its save, the ranks' exit, the slowest rank's."""
    launcher = {**(phases or {}), "save": save_s}
    if ranks_ended is not None and reports and all(r.written for r in reports):
        launcher["exit"] = max(0.0, ranks_ended - max(r.written for r in reports))
    return run_phases(launcher, [report.phases for report in reports])


def _write_metrics(
    settings: Settings,
    tally: _Tally,
    duration: float,
    run: dict[str, float],
    predictions: Sequence[Prediction],
    recovered: Mapping[str, int] | None,
) -> None:
    """The run's metrics into ``run_metrics_file``."""
    from warmup.metrics import RunMetrics  # prometheus: the finisher's, not every rank's

    metrics = RunMetrics()
    metrics.record(tally.shapes)
    metrics.record_models(tally.models)
    metrics.record_run(len(tally.reports), duration, run, tally.remote)
    metrics.record_predictions(predictions)
    metrics.record_skipped(len(tally.skipped))
    metrics.record_recovered(recovered or {})
    metrics.write(settings.run_metrics_file)


def _remote_counts(reports: list[RankReport]) -> RemoteCounts | None:
    """The remote tier's calls summed over the ranks that asked one (rank 0)."""
    asked = [report.remote for report in reports if report.remote is not None]
    return sum(asked[1:], asked[0]) if asked else None


def main(*, waited_s: float = 0.0) -> int:
    """A rank process: spawned by ``triton-warmup run`` (settings and manifest as files
    in its folder, the launcher's decisions in its environment), or started by torchrun
    (``torchrun --nproc-per-node N -m warmup.run.session``; settings from the environment).
    ``waited_s``: how long a rank started early waited for the launcher's go
    (``warmup.run.early``). Bad input is one line on stderr and exit 2, as from the CLI."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    child_of = os.environ.get(CHILD_FLAG)
    try:
        if child_of:
            run_dir = Path(child_of)
            settings = Settings.model_validate_json((run_dir / "settings.json").read_text())
            manifest = Manifest.model_validate_json((run_dir / "manifest.json").read_text())
        else:
            settings = Settings()
            manifest = load_manifest(settings.manifest)
            run_dir = settings.work_dir / "run"
            settings = _prepare_self_started(settings, manifest, world)
        logs.configure(settings.log_format, rank=rank, level=_log_level(settings))
        roles = LAUNCHED if child_of else SELF_STARTED
        return _run_rank(settings, manifest, rank, world, run_dir, roles, waited_s)
    except (ManifestError, MissingFolder, RunError, ValidationError) as e:
        lines = e.lines() if isinstance(e, ManifestError) else [f"{e}".replace("\n", "; ")]
        for line in lines:
            print(f"triton-warmup: error: rank {rank}: {line}", file=sys.stderr)
        return 2


def _log_level(settings: Settings) -> int:
    """DEBUG with ``--debug`` (``TRITON_WARMUP_DEBUG``): a failing build's traceback too."""
    return logging.DEBUG if settings.debug else logging.INFO


def _prepare_self_started(settings: Settings, manifest: Manifest, world: int) -> Settings:
    """Under torchrun: what the launcher does for the ranks it spawns, before anything
    imports triton (Triton reads its cache folder and the interpreter switch then)."""
    os.environ["TRITON_CACHE_DIR"] = str(settings.triton_cache_dir.resolve())
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    os.environ.update(inductor_environment(settings))
    return prepare(settings, manifest, world, str(settings.manifest), volume_fix=VOLUME_FIX_ENV)[0]


# How a self-started rank's caller asks for a volume to be made, in its own words.
VOLUME_FIX_ENV = "check TRITON_WARMUP_VOLUME, or create it with TRITON_WARMUP_CREATE_VOLUME=true"
VOLUME_FIX_PYTHON = "check Settings(volume=...), or pass Settings(create_volume=True) to create it"


def other_worlds_refused(settings: Settings, manifest: Manifest, world: int) -> str | None:
    """Why this run fails for entries of other world sizes (``other_world_sizes`` is
    'fail'), or None."""
    skipped = manifest.skipped_entries(world)
    if not skipped or settings.other_world_sizes != "fail":
        return None
    return (
        f"{len(skipped)} manifest entries are for other world sizes than this pod's "
        f"{world} ranks, and other_world_sizes is 'fail': {'; '.join(skipped[:5])}"
    )


def require_this_world_only(
    settings: Settings, manifest: Manifest, world: int, source: str
) -> None:
    """:class:`ManifestError` (bad input) before any rank starts when the manifest has
    entries for other world sizes and ``other_world_sizes`` is 'fail'."""
    refused = other_worlds_refused(settings, manifest, world)
    if refused:
        raise ManifestError(source, [refused])


def prepare(
    settings: Settings, manifest: Manifest, world: int, source: str, *, volume_fix: str
) -> tuple[Settings, bool]:
    """What a self-started rank (torchrun, ``warm()``) checks before it warms: the
    manifest has entries for ``world``, the volume is there (made with
    ``create_volume``; ``volume_fix`` says how otherwise), the device (the interpreter
    on for CPU), every kernel's shapes, the lock server. Returns the settings to warm
    with and whether the rank warms on its GPU."""
    manifest.require_world(world, source)
    require_this_world_only(settings, manifest, world, source)
    settings.existing_volume(volume_fix)
    cuda = uses_cuda(settings)
    manifest.check_kernels(source)  # imports the kernels: after the interpreter is on
    check_remote(settings)
    return lock_backend(settings, manifest, world), cuda


def check_remote(settings: Settings) -> None:
    """:class:`RunError` when the registry's remote tier is set and cannot be made (a
    bad URL, no redis-py); whether it answers is the tier's own business (it may not,
    and the run goes on with the local tier)."""
    try:
        settings.remote()
    except RegistryError as e:
        raise RunError(f"TRITON_WARMUP_REMOTE_URL: {e}") from None


def lock_backend(settings: Settings, manifest: Manifest, world: int) -> Settings:
    """Where this run locks, decided before any rank warms: a lock server must answer, or
    with ``lock_fallback`` file the run locks with the lease folder (the launcher decides
    once for the ranks it spawns; a torchrun or in-process rank decides for itself, and
    only rank 0 ever takes a lock)."""
    if not any(e.policy == "tune" and not e.is_user_function for e in manifest.entries_for(world)):
        return settings  # nothing will be tuned: no lock taken
    try:
        check_backend(settings.lock_backend())
    except LockServerUnreachable as e:
        if settings.lock_fallback != "file":
            raise RunError(
                f"{e}: start it, fix TRITON_WARMUP_LOCK_URL, "
                "or set TRITON_WARMUP_LOCK_FALLBACK=file"
            ) from None
        log.warning("%s: falling back to file leases in %s for this run", e, settings.paths.locks)
        return settings.updated(lock_url="")  # <volume>/locks, and the tier derived again
    return settings


def uses_cuda(settings: Settings) -> bool:
    """Whether this process warms on its GPU: ``device`` auto takes one when torch sees
    it, cuda requires it (:class:`RunError`). On CPU, Triton kernels run only in its
    interpreter, which Triton picks when it is imported: this turns it on, or says why
    it is too late."""
    cuda = _on_gpu(settings, "device cuda: torch sees no CUDA GPU in this process; use device cpu")
    if cuda or triton_internals.interpreting():
        return cuda
    try:
        triton_internals.enable_interpreter()
    except ValueError as e:
        raise RunError(
            f"warming on CPU runs Triton kernels in Triton's interpreter, and {e}: set "
            "TRITON_INTERPRET=1 before anything imports triton (or warm on a GPU)"
        ) from None
    log.info("no GPU: Triton's interpreter is on in this process (TRITON_INTERPRET=1)")
    return False


def _run_rank(
    settings: Settings,
    manifest: Manifest,
    rank: int,
    world: int,
    run_dir: Path,
    roles: Roles,
    waited_s: float = 0.0,
) -> int:
    import torch.distributed as dist

    clock = PhaseClock()
    clock.add("rank_start", process_age() - waited_s)  # this process's start and imports
    clock.add("rendezvous", waited_s)  # a rank started early: waiting for the launcher
    started = time.time() - process_age()  # time to ready counts from the process's start
    with clock.timing("rendezvous"):  # the GPU's context, then the process group
        device = _join_group(settings, rank, world, run_dir, roles)
    try:
        status = run_session(
            settings,
            manifest,
            rank=rank,
            world=world,
            group=dist.group.WORLD,
            device=device,
            run_dir=run_dir,
            roles=roles,
            started=started,
            clock=clock,
        )
    except BaseException:
        dist.destroy_process_group()
        raise
    if roles == LAUNCHED:  # past the last barrier, its report written: nothing is left
        logs.exit_now(0)  # no second of NCCL and CUDA teardown before the pod is ready
    dist.destroy_process_group()
    return 0 if status is None or status.ready else 1


def _join_group(settings: Settings, rank: int, world: int, run_dir: Path, roles: Roles) -> Any:
    """This rank's device made current, then the process group joined on it (NCCL on a
    GPU, gloo on the CPU); host detection starts first, to run while NCCL connects."""
    import torch.distributed as dist

    device = _rank_device(settings, rank)
    detect_in_background(device)  # hashing Triton while NCCL connects
    if rank == 0 and roles == LAUNCHED:
        _tell_host(device, run_dir)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=settings.rank_timeout_s),
        **({"device_id": device} if device.type == "cuda" else {}),
    )
    return device


def _tell_host(device: Any, run_dir: Path) -> None:
    """Write what this rank detects of its host for the launcher's ``explain``, on a
    thread once detection ends; a failure only leaves the launcher without it."""

    def tell() -> None:
        try:
            host = RankHost(fingerprint=detect_for(device).to_json(), triton_env=cache_env())
            host.write(run_dir)
        except Exception as e:
            log.warning("host facts not written for explain: %s: %s", type(e).__name__, e)

    threading.Thread(target=tell, name="tell-host", daemon=True).start()


def _rank_device(settings: Settings, rank: int) -> Any:
    """This rank's device, made current: its GPU (``LOCAL_RANK``), or the CPU."""
    import torch

    cuda = _on_gpu(settings, f"rank {rank}: device cuda, and torch sees no CUDA GPU here")
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda and local >= torch.cuda.device_count():
        raise RunError(f"rank {rank} needs GPU {local}; torch sees {torch.cuda.device_count()}")
    if not cuda:
        return torch.device("cpu")
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    return device


def _on_gpu(settings: Settings, refused: str) -> bool:
    """Whether this process warms on a GPU (:meth:`Settings.device_type` of the GPUs torch
    can run on: none when CUDA does not start, a driver that lists GPUs its runtime
    cannot use); :class:`RunError` saying ``refused`` when device cuda finds none."""
    import torch

    usable = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = settings.device_type(usable) == "cuda"
    if cuda and not usable:
        raise RunError(refused)
    return cuda


if __name__ == "__main__":
    sys.exit(main())
