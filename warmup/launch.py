"""``triton-warmup run``: restore, warm every shape on every rank, save, report.

One process per rank (or the processes torchrun started), each writing its records to
``<work_dir>/run/rank-<r>.json``; the launcher (or rank 0 under torchrun) sums them into
the metrics file and the status file, saves new compile artifacts to the volume and
imports Triton's own autotune results into the registry. Exit 0 when every shape is
warm, 1 otherwise (the status names each failed shape), 2 for bad input.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from registry import Store, atomic, triton_cache
from registry.fingerprint import Fingerprint, machine_name
from registry.importers import import_triton_autotune
from warmup.manifest import Manifest, ManifestError
from warmup.metrics import RunMetrics
from warmup.settings import Settings
from warmup.status import FAILED, READY, RUNNING, write_status

log = logging.getLogger(__name__)
CHILD_FLAG = "TRITON_WARMUP_RANK_CHILD"  # set in the rank processes this launcher starts
RESTORED = "restored"  # marker file: the compile cache is in place


class RunError(RuntimeError):
    """The run cannot start: wrong world size for the machine, no device."""


def run(settings: Settings, manifest: Manifest) -> dict[str, Any]:
    """Warm the manifest; returns the status written (``state`` ready or failed)."""
    started = time.time()
    world = settings.world_size or max(manifest.world_sizes())
    device = _device_type(settings)
    run_dir = settings.work_dir / "run"
    clear_run_dir(run_dir)
    write_status(
        settings.status_path,
        state=RUNNING,
        manifest_digest=manifest.digest(),
        started=started,
        host=machine_name(),
        world_size=world,
    )
    procs = _spawn_ranks(settings, manifest, world, device, run_dir)
    try:  # the kernels' shape checks import torch: while the ranks import theirs
        manifest.check_kernels(str(settings.manifest))
    except BaseException as e:  # no rank may outlive a run that cannot go on
        _stop(procs)
        errors = e.errors if isinstance(e, ManifestError) else [f"{type(e).__name__}: {e}"]
        write_status(
            settings.status_path,
            state=FAILED,
            manifest_digest=manifest.digest(),
            started=started,
            finished=time.time(),
            host=machine_name(),
            world_size=world,
            failures=errors,
        )
        raise
    # Restore while the ranks import torch; they wait for the marker before any kernel.
    restored = triton_cache.restore(settings.paths.triton_cache, settings.cache_dir)
    atomic.write_bytes(run_dir / RESTORED, b"")
    log.info(
        "restored %d compile artifacts (%d already there) into %s",
        restored.copied,
        restored.present,
        settings.cache_dir,
    )
    failures = _wait(procs, settings.run_timeout_s, settings.rank_timeout_s)
    return finish(settings, manifest, run_dir, world, started, failures)


def _device_type(settings: Settings) -> str:
    """Where the ranks warm. Decided without importing torch (seconds of start-up before
    any rank runs): the NVIDIA driver lists its GPUs in /proc; each rank then checks that
    its GPU exists and fails with a clear message otherwise."""
    if settings.device != "auto":
        return settings.device
    gpus = Path("/proc/driver/nvidia/gpus")
    return "cuda" if gpus.is_dir() and any(gpus.iterdir()) else "cpu"


def _spawn_ranks(
    settings: Settings, manifest: Manifest, world: int, device: str, run_dir: Path
) -> list[subprocess.Popen[bytes]]:
    """Start one process per rank."""
    atomic.write_json(run_dir / "settings.json", settings.model_dump(mode="json"))
    atomic.write_json(run_dir / "manifest.json", manifest.model_dump(mode="json"))
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TRITON_CACHE_DIR": str(settings.cache_dir.resolve()),
            "TRITON_CACHE_AUTOTUNING": "1",
            CHILD_FLAG: str(run_dir.resolve()),
        }
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        procs.append(subprocess.Popen([sys.executable, "-m", "warmup.launch"], env=env))
    return procs


def _wait(procs: list[subprocess.Popen[bytes]], limit_s: float, grace_s: float) -> list[str]:
    deadline = time.monotonic() + limit_s
    failures: list[str] = []
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            failures.append(f"the run exceeded its time limit of {limit_s:g} s")
            break
        dead = [
            (rank, p.returncode) for rank, p in enumerate(procs) if p.returncode not in (None, 0)
        ]
        if dead and not failures:
            failures += [f"rank {rank} exited with code {code}" for rank, code in dead]
            deadline = min(deadline, time.monotonic() + min(grace_s, 30.0))
        time.sleep(0.05)
    stopped = _stop(procs)
    failures += [f"rank {rank} was stopped" for rank in stopped]
    for rank, p in enumerate(procs):
        exited = f"rank {rank} exited with code {p.returncode}"
        if rank not in stopped and p.returncode != 0 and exited not in failures:
            failures.append(exited)
    return failures


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Kill every rank still running; returns their ranks."""
    stopped = []
    for rank, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            p.wait()
            stopped.append(rank)
    return stopped


def finish(
    settings: Settings,
    manifest: Manifest,
    run_dir: Path,
    world: int,
    started: float,
    failures: list[str],
) -> dict[str, Any]:
    """Sum every rank's records into metrics and status; save the compile cache."""
    reports = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank-*.json"))]
    missing = sorted(set(range(world)) - {r["rank"] for r in reports})
    failures = failures + [
        f"rank {r} reported nothing"
        for r in missing
        if not any(f.startswith(f"rank {r} ") for f in failures)
    ]
    metrics = RunMetrics()
    for report in reports:
        metrics.record(report["rows"])
    metrics.ranks.set(len(reports))
    saved = triton_cache.save(settings.cache_dir, settings.paths.triton_cache)
    fingerprint = reports[0]["fingerprint"] if reports else None
    imported = _import_autotune(settings, manifest, fingerprint)
    rows = [dict(row, rank=r["rank"]) for r in reports for row in r["rows"]]
    failed_shapes = [
        f"{row['kernel']} {row['key']} (rank {row['rank']}): {row['error']}"
        for row in rows
        if row.get("error")
    ]
    ready = not failures and not failed_shapes and len(reports) == world
    duration = time.time() - started
    metrics.duration.set(duration)
    metrics.write(settings.metrics_path)
    sources: dict[str, int] = {}
    for row in rows:
        sources[row["source"]] = sources.get(row["source"], 0) + 1
    return write_status(
        settings.status_path,
        state=READY if ready else FAILED,
        manifest_digest=manifest.digest(),
        started=started,
        finished=time.time(),
        duration_s=duration,
        host=machine_name(),
        world_size=world,
        fingerprint=fingerprint,
        sources=sources,
        benchmark_runs=sum(row.get("benchmark_runs", 0) for row in rows),
        failures=failures + failed_shapes,
        saved_artifacts=saved.copied,
        imported_entries=imported,
        shapes=[
            {
                k: row.get(k)
                for k in ("kernel", "key", "rank", "source", "seconds", "compile_seconds", "error")
            }
            for row in rows
        ],
    )


def _import_autotune(
    settings: Settings, manifest: Manifest, fingerprint: dict[str, Any] | None
) -> int:
    """Triton's own @triton.autotune choices (user entries) into the registry."""
    if fingerprint is None or not any(e.is_user_function for e in manifest.entries):
        return 0
    result = import_triton_autotune(settings.cache_dir, Fingerprint.from_json(fingerprint))
    for error in result.errors:
        log.warning("could not import %s", error)
    Store(settings.registry_path).put_many(result.entries)
    return len(result.entries)


def clear_run_dir(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in [*run_dir.glob("rank-*.json"), run_dir / RESTORED]:
        old.unlink(missing_ok=True)


def _wait_for_restore(run_dir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (run_dir / RESTORED).exists():
        if time.monotonic() > deadline:
            raise RunError(f"the compile cache was not restored within {timeout_s:g} s")
        time.sleep(0.01)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def warm_and_report(
    manifest: Manifest,
    settings: Settings,
    run_dir: Path,
    *,
    rank: int,
    world: int,
    group: Any,
    device: Any,
) -> None:
    """Warm this rank's shapes and leave its records where ``finish`` sums them."""
    from warmup.runner import progress_printer, warm_rank

    report = warm_rank(
        manifest,
        settings,
        rank=rank,
        world=world,
        group=group,
        device=device,
        progress=progress_printer() if rank == 0 else None,
    )
    atomic.write_json(run_dir / f"rank-{rank}.json", report.__dict__)


def rank_main() -> int:
    """A rank process: started by ``run`` (settings and manifest as files), or by torchrun
    (settings from the environment, rank 0 then sums up)."""
    import torch
    import torch.distributed as dist

    from warmup import logs
    from warmup.manifest import load_manifest

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    child_of = os.environ.get(CHILD_FLAG)
    if child_of:
        run_dir = Path(child_of)
        settings = Settings.model_validate_json((run_dir / "settings.json").read_text())
        manifest = Manifest.model_validate_json((run_dir / "manifest.json").read_text())
    else:
        settings = Settings()
        manifest = load_manifest(settings.manifest)
        run_dir = settings.work_dir / "run"
    logs.configure(settings.log_format, rank=rank)
    cuda = settings.device != "cpu" and torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", rank))
    if cuda and local >= torch.cuda.device_count():
        raise RunError(
            f"rank {rank} needs GPU {local}; this machine has {torch.cuda.device_count()}."
        )
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    started = time.time()
    if not child_of and rank == 0:  # torchrun: rank 0 restores before anyone compiles
        clear_run_dir(run_dir)
        triton_cache.restore(settings.paths.triton_cache, settings.cache_dir)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=settings.rank_timeout_s),
        **({"device_id": device} if cuda else {}),
    )
    try:
        if child_of:
            _wait_for_restore(run_dir, settings.rank_timeout_s)
        dist.barrier()
        warm_and_report(
            manifest,
            settings,
            run_dir,
            rank=rank,
            world=world,
            group=dist.group.WORLD,
            device=device,
        )
        dist.barrier()
        if not child_of and rank == 0:
            status = finish(settings, manifest, run_dir, world, started, [])
            return 0 if status["state"] == READY else 1
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(rank_main())
