"""One rank's warmup session: restore or wait → barrier → warm → barrier → report.

The one sequence every rank runs, whoever started it:

- a rank process that ``triton-warmup run`` spawned (``python -m warmup.run.session`` with
  the launcher's folder in ``TRITON_WARMUP_RANK_CHILD``): the launcher restores the
  compile cache and sums the reports, the rank waits for the first and leaves the second;
- a rank that torchrun started (the same command, no launcher): rank 0 restores and sums;
- ``warmup.warm()`` inside a server's own process: rank 0 restores and sums, and every
  rank gets the status back.

Each rank writes its typed :class:`~warmup.core.results.RankReport` into the run folder; the
run's end (``warmup.run.aggregate``) reads them back into the
:class:`~warmup.core.results.RunStatus`. What is checked before is ``warmup.run.checks``', what
is restored ``warmup.run.restore``'s.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from registry.core.errors import named
from registry.core.fingerprint import detect_for, detect_in_background
from registry.core.triton_internals import cache_env
from registry.core.volume import MissingFolder
from warmup.compiled.environment import inductor_environment
from warmup.core import logs
from warmup.core.manifest import Manifest, ManifestError, load_manifest
from warmup.core.results import RankHost, RunStatus
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run import checks
from warmup.run.aggregate import RunRecord, finish, running
from warmup.run.checks import RunError, on_gpu
from warmup.run.phases import PhaseClock, process_age
from warmup.run.restore import clear_run_dir, restore, wait_for_restore

log = logging.getLogger(__name__)
CHILD_FLAG = "TRITON_WARMUP_RANK_CHILD"  # set in the rank processes the launcher starts


@dataclass(frozen=True)
class Roles:
    """Who does the work around the ranks' own: the launcher (``False``) or rank 0."""

    restores: bool
    finishes: bool


LAUNCHED = Roles(restores=False, finishes=False)  # ``triton-warmup run`` spawned us
SELF_STARTED = Roles(restores=True, finishes=True)  # torchrun, or warm() in-process


def run_session(
    services: Services,
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
    ``clock`` has what this rank spent before (its start, the process group); ``services``:
    those its entry point built (the launcher's rank, torchrun's, ``warm()``)."""
    clock = clock or PhaseClock()
    with clock.timing("rank_start"):  # the kernels and triton, imported here
        from warmup.compiled.progress import model_progress_printer  # after the environment is set
        from warmup.run.runner import progress_printer, warm_rank  # imports torch, after the enviro

    recovered = _restored(services, manifest, rank, world, group, run_dir, roles, started, clock)
    report = warm_rank(
        manifest,
        services,
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
        record = RunRecord.of(services, manifest, world, started, run_dir, recovered=recovered)
        status = _finish_or_fail(record)
    return _shared_status(status, group)


def _restored(
    services: Services,
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
    settings = services.settings
    if not roles.restores:
        with clock.timing("rendezvous"):
            wait_for_restore(run_dir, settings.run.run_timeout_s)
    elif rank == 0:
        clear_run_dir(run_dir)
        running(manifest, world, started).write(settings.paths.status_file)  # not ready
        with clock.timing("restore"):
            recovered = restore(services, manifest)
    with clock.timing("rendezvous"):
        _barrier(group)
    return recovered


def _finish_or_fail(record: RunRecord) -> RunStatus:
    """Rank 0's :func:`~warmup.run.aggregate.finish`; a failure in it is said in a failed
    status."""
    try:
        return finish(record)
    except Exception as e:  # said in the status, and told to every rank
        status = running(record.manifest, record.world, record.started).failed([named(e)])
        return status.write(record.settings.paths.status_file)


def _shared_status(status: RunStatus | None, group: Any) -> RunStatus | None:
    """Rank 0's status, broadcast to every rank of ``group`` (none: as it is)."""
    if group is None:
        return status
    import torch.distributed as dist  # torch loads on first use

    holder = [status.model_dump(mode="json") if status else None]
    dist.broadcast_object_list(holder, src=0, group=group)
    return status if status is not None else RunStatus.model_validate(holder[0])  # rank 0's own


def _barrier(group: Any) -> None:
    if group is not None:
        import torch.distributed as dist  # torch loads on first use

        dist.barrier(group=group)


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
            services = Services(settings, run=True)  # this rank's: the launcher checked them
        else:
            settings = Settings()
            manifest = load_manifest(settings.paths.manifest)
            run_dir = settings.paths.work_dir / "run"
            services = _prepare_self_started(settings, manifest, world)
            settings = services.settings
        logs.configure(settings.logs.format, rank=rank, level=_log_level(settings))
        roles = LAUNCHED if child_of else SELF_STARTED
        return _run_rank(services, manifest, rank, world, run_dir, roles, waited_s)
    except (ManifestError, MissingFolder, RunError, ValidationError) as e:
        lines = e.lines() if isinstance(e, ManifestError) else [f"{e}".replace("\n", "; ")]
        for line in lines:
            print(f"triton-warmup: error: rank {rank}: {line}", file=sys.stderr)
        return 2


def _log_level(settings: Settings) -> int:
    """DEBUG with ``--debug`` (``TRITON_WARMUP_DEBUG``): a failing build's traceback too."""
    return logging.DEBUG if settings.logs.debug else logging.INFO


def _prepare_self_started(settings: Settings, manifest: Manifest, world: int) -> Services:
    """Under torchrun: what the launcher does for the ranks it spawns, before anything
    imports triton (Triton reads its cache folder and the interpreter switch then); the
    services the checks leave to run with."""
    os.environ["TRITON_CACHE_DIR"] = str(settings.folders.triton_cache_dir.resolve())
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    os.environ.update(inductor_environment(settings))
    caller = checks.self_started(str(settings.paths.manifest), checks.VOLUME_FIX_ENV)
    return checks.checked(Services(settings, run=True), manifest, world, caller).services


def _run_rank(
    services: Services,
    manifest: Manifest,
    rank: int,
    world: int,
    run_dir: Path,
    roles: Roles,
    waited_s: float = 0.0,
) -> int:
    import torch.distributed as dist  # torch loads on first use

    settings, clock = services.settings, PhaseClock()
    clock.add("rank_start", process_age() - waited_s)  # this process's start and imports
    clock.add("rendezvous", waited_s)  # a rank started early: waiting for the launcher
    started = time.time() - process_age()  # time to ready counts from the process's start
    with clock.timing("rendezvous"):  # the GPU's context, then the process group
        device = _join_group(settings, rank, world, run_dir, roles)
    try:
        status = run_session(
            services,
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
    import torch.distributed as dist  # torch loads on first use

    device = _rank_device(settings, rank)
    detect_in_background(device)  # hashing Triton while NCCL connects
    if rank == 0 and roles == LAUNCHED:
        _tell_host(device, run_dir)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=settings.run.rank_timeout_s),
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
    import torch  # torch loads on first use

    cuda = on_gpu(settings, f"rank {rank}: device cuda, and torch sees no CUDA GPU here")
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda and local >= torch.cuda.device_count():
        raise RunError(f"rank {rank} needs GPU {local}; torch sees {torch.cuda.device_count()}")
    if not cuda:
        return torch.device("cpu")
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    return device


if __name__ == "__main__":
    sys.exit(main())
