"""Settle passes: what a fresh server process would still compile, compiled by the warm.

A compiled model's first warm can leave work for the next process on its cache. With
``max-autotune`` (coordinate-descent tuning on), Inductor tunes kernels as they first
run, and a fresh process on the stored cache tunes and compiles a part of them again:
on one H200, the 4-block model of issue [3.1] compiled 399 Triton kernels cold, then 24,
6 and 0 in three fresh processes on the same cache. A server must pay none of that.

So, after the ranks finish, the launcher runs each model that tuned at run time again
in fresh rank processes (that model alone, the same world), each pass on the pod's
caches, which stores what it added, until a pass compiles nothing on any rank, a pass
leaves the pod's caches as they were (the next process would do the same again: on that
H200, 3 kernels compiled in every process, none of them ever cached), or
``model_settle_passes`` passes ran. Every rank's result lists each pass's counts and
the files it added to the caches in ``settle``, and says whether the last one compiled
nothing (``settled``). A pass that fails costs its time, never the model: the first
pass warmed it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.caches import inductor_cache, triton_cache
from warmup.core.manifest import Manifest
from warmup.core.results import ModelResult, RankReport
from warmup.core.settings import Settings

log = logging.getLogger(__name__)

# (the manifest of this pass, its run folder) -> each rank's report of the pass
RunPass = Callable[[Manifest, Path], list[RankReport]]


def tuned_at_run_time(result: ModelResult) -> bool:
    return not result.failed and result.counts.get("autotune_runs", 0) > 0


def compiled(result: ModelResult) -> int:
    return result.counts.get("kernel_compiles", 0) + result.counts.get("inductor_compiles", 0)


def settle(settings: Settings, manifest: Manifest, run_dir: Path, run_pass: RunPass) -> float:
    """Run the settle passes for the models the reports in ``run_dir`` say tuned at run
    time, write what each pass counted into those reports, and return the seconds spent."""
    started = time.perf_counter()
    try:
        reports = RankReport.read_all(run_dir)
    except (OSError, ValueError):  # finish says so
        return 0.0
    pending = sorted({m.name for r in reports for m in r.models if tuned_at_run_time(m)})
    caches = (
        settings.folders.inductor_cache_dir,
        settings.folders.triton_cache_dir,
    )
    number = 0
    while pending and number < settings.models.settle_passes:
        number += 1
        before = _files(*caches)
        log.info("settle pass %d: %s, in fresh rank processes", number, ", ".join(pending))
        subset = manifest.model_copy(
            update={"entries": [], "models": [m for m in manifest.models if m.name in pending]}
        )
        try:
            found = {
                (model.name, report.rank): model
                for report in run_pass(subset, run_dir / f"settle-{number}")
                for model in report.models
            }
        except Exception as e:  # the models are warm already: this pass is lost
            log.warning("settle pass %d failed: %s", number, e)
            found = {}
        added = len(_files(*caches) - before)
        pending = _record(reports, pending, found, number, added)
    for report in reports:
        report.write(run_dir, restamp=False)
    if number:
        log.info("settle passes: %d in %.1f s", number, time.perf_counter() - started)
    return time.perf_counter() - started if number else 0.0


def _record(
    reports: list[RankReport],
    pending: list[str],
    found: dict[tuple[str, int], ModelResult],
    number: int,
    added: int,
) -> list[str]:
    """Each rank's pass result (and the files the pass ``added`` to the caches) into its
    model's ``settle``; the models still to settle."""
    still = []
    for name in pending:
        mine = [
            (model, found.get((name, report.rank)))
            for report in reports
            for model in report.models
            if model.name == name
        ]
        whole = all(got is not None and not got.failed for _, got in mine)
        for model, got in mine:
            model.settle.append({**_pass(got), "new_files": added})
        if not whole:
            log.warning("model %s: settle pass %d did not run on every rank; stopped", name, number)
        elif any(compiled(got) for _, got in mine if got is not None):
            if added:
                still.append(name)
            else:
                log.warning(
                    "model %s: settle pass %d compiled and cached nothing new: a server "
                    "compiles the same again (not cached by this torch)",
                    name,
                    number,
                )
        else:
            for model, _ in mine:
                model.settled = True
    return still


def _pass(result: ModelResult | None) -> dict[str, Any]:
    if result is None:
        return {"error": "no result"}
    if result.failed:
        return {"error": result.error or result.phase}
    return {**result.counts, "seconds": round(result.seconds, 3)}


def _files(inductor: Path, triton: Path) -> set[tuple[str, int]]:
    """Every finished artifact of the pod's Inductor and Triton caches, with its size
    (locks and temporary files left out): what a pass added shows as new."""
    listed = [*inductor_cache.cache_files(inductor), *triton_cache.cache_files(triton)]
    found = set()
    for _, path in listed:
        with contextlib.suppress(OSError):
            found.add((str(path), path.stat().st_size))
    return found
