"""``triton-warmup run``: the parent launcher. It checks its input
(``warmup.run.checks``), starts one process per rank (``python -m warmup.run.session``),
restores the compile cache while they import torch, watches them, and sums their reports
(``warmup.run.aggregate.finish``) into the metrics and status files. Exit 0 when every
shape is warm, 1 otherwise (the status names each failed shape), 2 for bad input.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from registry.core import atomic
from registry.core.errors import named
from registry.storage import hosts
from registry.trust.signing import announce
from warmup.caches import explain
from warmup.compiled.environment import inductor_environment
from warmup.core.manifest import Manifest, ManifestError
from warmup.core.results import RankFailure, RankReport, RunStatus
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run import checks, full_hit
from warmup.run.aggregate import RunRecord, finish, running
from warmup.run.checks import RunError
from warmup.run.early import EarlyRanks
from warmup.run.gpus import GPU_LIST, visible_gpus
from warmup.run.phases import process_age
from warmup.run.restore import clear_run_dir, mark_restored, restore
from warmup.run.session import CHILD_FLAG
from warmup.run.settle import settle

log = logging.getLogger(__name__)
__all__ = ["RunError", "run"]


def run(settings: Settings, manifest: Manifest, early: EarlyRanks | None = None) -> RunStatus:
    """Warm the manifest; returns the status written (``state`` ready or failed).
    :class:`RunError` or :class:`ManifestError` before any rank starts on bad input.
    ``early``: rank processes the program started ahead (``warmup.run.early``): the
    first ranks, as many as the run has; any more are ended."""
    early = early or EarlyRanks([], 0.0)
    try:
        return _launch(settings, manifest, early)
    finally:
        early.stop()  # any not handed over: bad input, more than the ranks


def _launch(settings: Settings, manifest: Manifest, early: EarlyRanks) -> RunStatus:
    """:func:`run` once the input is checked: the ranks spawned, the cache restored while
    they start, their reports summed; a failure is written into the status."""
    started = time.time() - process_age()  # time to ready counts from the process's start
    phases: dict[str, float] = {}
    services = Services(settings, run=True)  # the launcher's, built once: its entry point
    trust = services.trust  # a keys folder it cannot use: bad input, before any rank
    services, world, device = _checked(services, manifest)
    settings = services.settings
    announce(trust)  # once the input is good: a bad input's error stays one line
    found = hosts.probe(device, visible_gpus(GPU_LIST))
    hit = (
        full_hit.look(services, manifest, world, found, services.remote)
        if settings.run.full_hit_exit
        else None
    )
    if isinstance(hit, full_hit.FullHit):
        early.stop()  # no rank is needed: the server primes on what is restored
        log.info("full hit: every declared shape and model is stored for this host")
        phases["imports"] = process_age()
        return full_hit.restore_and_finish(
            services, manifest, world, hit, started=started, phases=phases
        )
    if hit is not None and full_hit.nothing_for_ranks(services, manifest, world):
        early.stop()
        log.info("no rank needed: the server compiles what is not stored (%s)", hit)
        phases["imports"] = process_age()
        return full_hit.leave_to_the_server(
            services, manifest, world, found, started=started, phases=phases
        )
    if hit is not None:
        log.info("warming in rank processes: %s", hit)
    run_dir = settings.paths.work_dir / "run"
    clear_run_dir(run_dir)
    status = running(manifest, world, started).write(settings.paths.status_file)
    early.keep(world)
    # this process's start, imports and the checks above: until the last rank starts
    phases["imports"] = early.started_s if len(early) == world else process_age()
    # The ranks run this launcher's decision on the device, not one of their own.
    ranks = settings.updated(device=device)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = _spawn_ranks(ranks, manifest, world, run_dir, early)
        # the checks' kernel step (warmup.run.checks): it imports torch, while the ranks do
        manifest.check_kernels(str(settings.paths.manifest))
        recovered, explaining = _restore_for_ranks(services, manifest, run_dir, phases)
        failures, errors = _wait(procs, settings.run.run_timeout_s, settings.run.rank_timeout_s)
        ended = time.time()
        if not failures and not errors:
            deadline = started + settings.run.run_timeout_s  # the run's limit bounds the passes
            phases["settle"] = settle(
                settings, manifest, run_dir, functools.partial(_settle_pass, ranks, world, deadline)
            )
        record = RunRecord.of(
            services,
            manifest,
            world,
            started,
            run_dir,
            rank_failures=tuple(failures),
            errors=tuple(errors),
            phases=phases,
            ranks_ended=ended,
            predictions=tuple(explaining.result()),
            recovered=recovered,
        )
        status = finish(record)
        full_hit.record_host(services, manifest, world, found, status)
        return status
    except BaseException as e:  # a status that says why; no rank outlives the run
        errors = e.errors if isinstance(e, ManifestError) else [named(e)]
        status.failed(errors).write(settings.paths.status_file)
        raise
    finally:
        _stop(procs)


def _checked(services: Services, manifest: Manifest) -> tuple[Services, int, str]:
    """Before any rank starts: the checks (``warmup.run.checks``) for the world size the
    settings ask, or the manifest's largest. Returns the services to run with, the world
    size and the ranks' device type; :class:`RunError` or :class:`ManifestError` on bad
    input."""
    settings = services.settings
    world = settings.run.world_size or max(manifest.world_sizes(), default=1)  # folders alone: 1
    caller = checks.launcher(str(settings.paths.manifest))
    checked = checks.checked(services, manifest, world, caller)
    return checked.services, world, checked.device


def _restore_for_ranks(
    services: Services, manifest: Manifest, run_dir: Path, phases: dict[str, float]
) -> tuple[dict[str, int], explain.Background]:
    """The volume into the pod while the ranks import torch, then the marker they wait
    for; ``explain`` starts on rank 0's host. Returns what the recovery cleared, and the
    explanation under way; adds the ``restore`` phase."""
    restoring = time.perf_counter()
    recovered = restore(services, manifest)  # while the ranks import torch; they wait for it
    mark_restored(run_dir)
    explaining = explain.Background(services, manifest, run_dir)  # rank 0's host
    phases["restore"] = time.perf_counter() - restoring
    return recovered, explaining


def _settle_pass(
    settings: Settings, world: int, deadline: float, manifest: Manifest, run_dir: Path
) -> list[RankReport]:
    """One settle pass (``warmup.run.settle``): fresh rank processes for ``manifest`` on
    the pod's caches, as restored already, within what is left of the run's time limit
    (``deadline``, a ``time.time()``); each rank's report."""
    left = deadline - time.time()
    if left < 1.0:
        raise RunError("no time is left of the run's limit (TRITON_WARMUP_RUN_TIMEOUT_S)")
    clear_run_dir(run_dir)
    procs = _spawn_ranks(settings, manifest, world, run_dir, EarlyRanks([], 0.0))
    try:
        mark_restored(run_dir)
        failures, errors = _wait(procs, left, settings.run.rank_timeout_s)
    finally:
        _stop(procs)
    if failures or errors:
        raise RunError("; ".join([*map(str, failures), *errors]))
    return RankReport.read_all(run_dir)


def _spawn_ranks(
    settings: Settings, manifest: Manifest, world: int, run_dir: Path, early: EarlyRanks
) -> list[subprocess.Popen[bytes]]:
    """One process per rank: those started early first, then new ones for the rest."""
    atomic.write_json(run_dir / "settings.json", settings.model_dump(mode="json"))
    atomic.write_json(run_dir / "manifest.json", manifest.model_dump(mode="json"))
    port = _free_port()
    envs = []
    for rank in range(world):
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TRITON_CACHE_DIR": str(settings.folders.triton_cache_dir.resolve()),
            "TRITON_CACHE_AUTOTUNING": "1",
            **inductor_environment(settings),
            CHILD_FLAG: str(run_dir.resolve()),
            # a model's build that makes Serving() from the environment (serving ops in its
            # graph) sees this run's paths, given as options or variables
            "TRITON_WARMUP_MANIFEST": str(settings.paths.manifest.resolve()),
            "TRITON_WARMUP_VOLUME": str(settings.paths.volume.resolve()),
            "TRITON_WARMUP_WORK_DIR": str(settings.paths.work_dir.resolve()),
        }
        if settings.run.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        envs.append(env)
    procs = early.hand_over(envs[: len(early)]) if len(early) else []
    command = [sys.executable, "-m", "warmup.run.session"]
    try:
        for env in envs[len(procs) :]:
            procs.append(subprocess.Popen(command, env={**os.environ, **env}))
    except BaseException:  # the ranks started so far would wait for their peers
        _stop(procs)
        raise
    return procs


def _wait(
    procs: list[subprocess.Popen[bytes]], limit_s: float, grace_s: float
) -> tuple[list[RankFailure], list[str]]:
    """Wait for every rank; after the first failure the others get ``grace_s`` (at most
    30 s) to finish. Returns each failed rank's first cause, and run-level errors."""
    deadline = time.monotonic() + limit_s
    failures: dict[int, RankFailure] = {}
    errors: list[str] = []
    timed_out = False
    while any([p.poll() is None for p in procs]):  # a list: poll every one, every time
        if time.monotonic() > deadline:
            timed_out = not failures
            if timed_out:
                errors.append(f"the run exceeded its time limit of {limit_s:g} s")
            break
        for rank, p in enumerate(procs):
            if p.returncode not in (None, 0) and rank not in failures:
                if not failures:
                    deadline = min(deadline, time.monotonic() + min(grace_s, 30.0))
                failures[rank] = RankFailure(rank=rank, end="exited", code=p.returncode)
        time.sleep(0.05)
    for rank in _stop(procs):
        failures.setdefault(rank, RankFailure(rank=rank, end="timeout" if timed_out else "stopped"))
    for rank, p in enumerate(procs):
        if p.returncode != 0:
            failures.setdefault(rank, RankFailure(rank=rank, end="exited", code=p.returncode))
    return [failures[r] for r in sorted(failures)], errors


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Kill every rank still running; returns their ranks."""
    stopped = []
    for rank, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            p.wait()
            stopped.append(rank)
    return stopped


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
