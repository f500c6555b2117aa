"""The run's end: every rank's report summed into the status and the metrics, the
caches saved.

Whoever ends a run describes it in one :class:`RunRecord`: the launcher once its ranks
have exited, rank 0 of a self-started run (torchrun, ``warmup.warm()``), a full hit that
started no rank (``warmup.run.full_hit``). :func:`finish` reads the ranks' typed
:class:`~warmup.core.results.RankReport` files back from the record's run folder into the
:class:`~warmup.core.results.RunStatus`; a run without ranks writes its status with
:func:`ended` from a :class:`Tally` of its own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from registry.core.explain import Prediction
from registry.core.fingerprint import Fingerprint, machine_name
from registry.core.triton_internals import cache_env
from warmup.caches import families
from warmup.core.manifest import Manifest
from warmup.core.results import (
    RUNNING,
    ModelResult,
    RankFailure,
    RankReport,
    RemoteCounts,
    RunStatus,
    ShapeResult,
)
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run.checks import other_worlds_refused
from warmup.run.phases import run_phases


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run, as its end sees it: what was asked, when it started, and what the ranks'
    reports cannot say themselves (the launcher's view of its ranks and its phases)."""

    services: Services  # the run's, as its entry point built them
    manifest: Manifest
    world: int
    started: float  # time.time() at the process's start: time to ready counts from it
    run_dir: Path | None = None  # the ranks' reports; None: no rank ran (a full hit)
    rank_failures: tuple[RankFailure, ...] = ()  # as the launcher saw its ranks end
    errors: tuple[str, ...] = ()  # run-level: the time limit
    phases: Mapping[str, float] = field(default_factory=dict)  # the launcher's own
    ranks_ended: float | None = None  # time.time() when the launcher saw its last rank exit
    predictions: tuple[Prediction, ...] = ()  # warmup.explain's, before the warm
    recovered: Mapping[str, int] = field(default_factory=dict)  # the restore's, by kind

    @property
    def settings(self) -> Settings:
        """The run's settings (those of its services)."""
        return self.services.settings

    @classmethod
    def of(
        cls,
        services: Services,
        manifest: Manifest,
        world: int,
        started: float,
        run_dir: Path | None = None,
        **ended: Any,
    ) -> RunRecord:
        """The record of a run of ``manifest`` over ``world`` ranks from ``started``;
        ``ended``: what its end saw (the fields after ``run_dir``, by name)."""
        record = cls(services=services, manifest=manifest, world=world, started=started)
        return dataclasses.replace(record, run_dir=run_dir, **ended)


@dataclass(frozen=True)
class Tally:
    """What the run did, summed: the ranks' reports read back (none without ranks), and
    every way it fell short."""

    shapes: list[ShapeResult]
    models: list[ModelResult]  # by model, then rank
    skipped: list[str]  # the manifest's entries for other world sizes
    reports: list[RankReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failures: dict[int, RankFailure] = field(default_factory=dict)  # a rank's first cause
    remote: RemoteCounts | None = None  # the remote tier's calls, summed

    @property
    def ready(self) -> bool:
        """No error, no failed rank, no failed shape or model."""
        return (
            not self.errors
            and not self.failures
            and not any(s.failed for s in self.shapes)
            and not any(m.failed for m in self.models)
        )


@dataclass(frozen=True)
class Saved:
    """The host the status names, and what saving the caches did (nothing, without
    ranks: a full hit restores only)."""

    fingerprint: dict[str, Any] | None  # the first rank's, or the host record's
    triton_env: dict[str, str]
    copied: int = 0
    imported: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # a family's step that raised


def running(manifest: Manifest, world: int, started: float) -> RunStatus:
    """The status of a run under way: never ready."""
    return RunStatus(
        state=RUNNING,
        manifest_digest=manifest.digest(),
        started=started,
        host=machine_name(),
        world_size=world,
    )


def finish(record: RunRecord) -> RunStatus:
    """Sum every rank's report into metrics and status; save the compile cache. The
    record's ``phases`` are what the launcher spent before the ranks' reports
    (``warmup.run.phases``); from the last report to its ``ranks_ended`` is the ranks'
    ``exit`` phase.

    Ready only when every rank reported every shape of the manifest's entries for the
    record's world size, none failed, and there was at least one."""
    assert record.run_dir is not None, "finish sums the reports of a run with ranks"
    tally = _tally(record, record.run_dir)
    saved = _save_caches(record.services, record.manifest, tally.reports)
    tally = replace(tally, errors=[*tally.errors, *saved.errors])  # a cache not saved fails it
    run = _run_phases(record.phases, saved.seconds, record.ranks_ended, tally.reports)
    duration = time.time() - record.started
    write_metrics(record, tally, duration, run)
    return ended(record, tally, saved, duration=duration, phases=run)


def ended(
    record: RunRecord,
    tally: Tally,
    saved: Saved,
    *,
    duration: float,
    phases: Mapping[str, float],
    **fields: Any,
) -> RunStatus:
    """The ended run's status, written: ready only when the tally found nothing wrong.
    ``fields``: the status's own for a run without ranks (``full_hit``, ``probe``)."""
    status = RunStatus.ended(
        ready=tally.ready,
        manifest_digest=record.manifest.digest(),
        world=record.world,
        started=record.started,
        duration=duration,
        fingerprint=saved.fingerprint,
        triton_env=saved.triton_env,
        errors=tally.errors,
        rank_failures=[tally.failures[r] for r in sorted(tally.failures)],
        skipped_entries=tally.skipped,
        benchmark_runs=sum(s.benchmark_runs for s in tally.shapes),
        saved_artifacts=saved.copied,
        imported_entries=saved.imported,
        phases=dict(phases),
        remote=tally.remote,
        shapes=tally.shapes,
        models=tally.models,
        trust=record.services.trust.mode,
        engine_keys=families.engine_keys(record.manifest),
        **fields,
    )
    return status.write(record.settings.paths.status_file)


def _tally(record: RunRecord, run_dir: Path) -> Tally:
    """Every rank's report in ``run_dir``, checked against the manifest's entries for the
    record's world size; a rank without one failed silently."""
    errors = list(record.errors)
    try:
        reports = RankReport.read_all(run_dir)
    except (OSError, ValueError) as e:
        reports, errors = [], [*errors, f"a rank report is unreadable: {e}"]
    failures = {f.rank: f for f in record.rank_failures}
    for rank in sorted(set(range(record.world)) - {r.rank for r in reports}):
        failures.setdefault(rank, RankFailure(rank=rank, end="silent"))
    errors += _shortfalls(record.settings, record.manifest, record.world, reports)
    models = (model for report in reports for model in report.models)
    return Tally(
        reports=reports,
        errors=errors,
        failures=failures,
        skipped=record.manifest.skipped_entries(record.world),
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
    if refused:  # a backstop: the checks refuse it before any rank (warmup.run.checks)
        errors.append(refused)
    for report in reports:
        if len(report.shapes) != expected:
            errors.append(f"rank {report.rank} reported {len(report.shapes)} of {expected} shapes")
        if len(report.models) != models_expected:
            errors.append(
                f"rank {report.rank} reported {len(report.models)} of {models_expected} models"
            )
    return errors


def _save_caches(services: Services, manifest: Manifest, reports: list[RankReport]) -> Saved:
    """Every cache family onto the volume, once the families keyed by the host (now
    known: the first rank's fingerprint) are restored for the server."""
    saving = time.perf_counter()
    fingerprint = reports[0].fingerprint if reports else None
    host = Fingerprint.from_json(fingerprint) if fingerprint else None
    where = families.scope(services, manifest, fingerprint=host, models=False)
    restored = families.restore(where, needing_host=True) if host is not None else []
    saved = families.save(where)
    return Saved(
        fingerprint=fingerprint,
        triton_env=cache_env() if host is not None else {},
        copied=sum(moved.copied for moved in saved),
        imported=sum(moved.entries for moved in saved),
        seconds=time.perf_counter() - saving,
        errors=families.failures(saved) + families.failures(restored),
    )


def _run_phases(
    phases: Mapping[str, float],
    save_s: float,
    ranks_ended: float | None,
    reports: list[RankReport],
) -> dict[str, float]:
    """The run's phases: the launcher's, its save, the ranks' exit, the slowest rank's."""
    launcher = {**phases, "save": save_s}
    if ranks_ended is not None and reports and all(r.written for r in reports):
        launcher["exit"] = max(0.0, ranks_ended - max(r.written for r in reports))
    return run_phases(launcher, [report.phases for report in reports])


def write_metrics(record: RunRecord, tally: Tally, duration: float, run: dict[str, float]) -> None:
    """The run's metrics into ``run_metrics_file`` (a run that started no rank too: no
    report, no prediction)."""
    from warmup.core.metrics import RunMetrics  # prometheus: the finisher's, not every rank's

    metrics = RunMetrics()
    metrics.record(tally.shapes)
    metrics.record_models(tally.models)
    # the ranks the warm state is for, even when a full hit started no rank process
    metrics.record_run(record.world, duration, run, tally.remote, rank_processes=len(tally.reports))
    metrics.record_predictions(record.predictions)
    metrics.record_skipped(len(tally.skipped))
    metrics.record_recovered(record.recovered)
    metrics.write(record.settings.paths.run_metrics_file)


def _remote_counts(reports: list[RankReport]) -> RemoteCounts | None:
    """The remote tier's calls summed over the ranks that asked one (rank 0)."""
    asked = [report.remote for report in reports if report.remote is not None]
    return sum(asked[1:], asked[0]) if asked else None
