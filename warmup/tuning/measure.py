"""A task's candidates searched on every rank in lockstep, the registry left out: rank
0's list shared, every candidate compiled in parallel, each launched and checked once
and timed by successive halving (its time the max over ranks), the winner weighed
against the baseline on the just-in-time clock (:mod:`warmup.tuning.latency_guard`),
shared from rank 0 and checked again. The tuner (:mod:`warmup.tuning.tuner`) stores
what this finds.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.task import TuneTask, check_contract
from registry import KernelConfig, Measurement
from registry.core.errors import named
from registry.locks import Holder, LockLost
from warmup.core.collectives import Candidates, Chosen, Lockstep, RankFailure
from warmup.tuning import compile_pool
from warmup.tuning.latency_guard import latency_guard
from warmup.tuning.search import HalvingPlan, SearchResult, successive_halving, summarize
from warmup.tuning.timing import Timer

log = logging.getLogger(__name__)


class TuneError(RuntimeError):
    """No usable config: the policy forbids tuning a miss, or every candidate failed."""


@dataclass
class Searched:
    """What a search found: the winner every rank took, the search, the parallel
    compile's report, how many files Triton's cache gained while timing (None: not
    watched; any is a compile the warm-ups missed) and notes of what it decided."""

    best: KernelConfig
    search: SearchResult
    pool: compile_pool.PoolReport | None = None
    cache_files_added: int | None = None
    notes: list[str] = field(default_factory=list)


def search_candidates(
    task: TuneTask,
    *,
    timer: Timer,
    lockstep: Lockstep,
    plan: HalvingPlan,
    latency_timer: Timer | None = None,
    workers: Callable[[], int] | None = None,
    cache_dir: Path | None = None,
    holder: Holder | None = None,
) -> Searched:
    """Search ``task``'s candidates on every rank of ``lockstep`` (see the module
    docstring); ``workers``: the parallel compile's size (None: no pool), ``cache_dir``:
    TRITON_CACHE_DIR, watched while timing. :class:`TuneError` when the space is empty,
    every candidate failed or the winner fails its check again. ``holder``: rank 0's
    fleet lock, checked after every measurement: :class:`LockLost` on every rank alike
    once it is lost (another pod may be tuning the shape now)."""
    check_contract(task)
    mine = Candidates(configs=task.candidates()) if lockstep.leader else None
    candidates = lockstep.share(mine, Candidates, what="candidate list").configs
    if not candidates:
        raise TuneError(f"{task.kernel} at {task.key()}: the config space is empty.")
    pool = compile_candidates(task, candidates, workers=workers)
    before = compile_pool.cache_files(cache_dir) if cache_dir else None
    failures: dict[KernelConfig, str] = {}
    baseline = baseline_of(task, candidates)
    measure = measurer(task, failures, timer=timer, lockstep=lockstep, holder=holder)
    search = successive_halving(candidates, measure, plan, baseline=baseline)
    notes = latency_guard(task, search, baseline, timer=latency_timer, lockstep=lockstep)
    mine_best = Chosen(config=search.best.config) if lockstep.leader else None
    best = lockstep.share(mine_best, Chosen, what="winner").config
    if not search.best.ok:
        reasons = "; ".join(f"{c.label()}: {r}" for c, r in list(failures.items())[:5])
        raise TuneError(f"{task.kernel} at {task.key()}: every candidate failed ({reasons}).")
    _check_winner(task, best, lockstep)
    added = None
    if before is not None and cache_dir is not None:
        added = compile_pool.cache_files(cache_dir) - before
    return Searched(best, search, pool, added, notes)


def baseline_of(task: TuneTask, candidates: Sequence[KernelConfig]) -> KernelConfig | None:
    """The task's baseline (:meth:`kernels.task.TuneTask.baseline`) when it is among the
    candidates searched."""
    found = task.baseline()
    return found if found in candidates else None


def compile_candidates(
    task: TuneTask,
    candidates: Sequence[KernelConfig],
    *,
    workers: Callable[[], int] | None,
) -> compile_pool.PoolReport | None:
    """Compile all candidates in parallel (a pool of ``workers()``; None: no pool), then
    warm each in-process (a cache hit)."""
    report = None
    if workers is not None:
        try:
            report = compile_pool.precompile(
                [functools.partial(task.warmup, c) for c in candidates], workers=workers()
            )
        except Exception as e:  # no driver (CPU), no fork: the warm-ups below compile
            log.debug("parallel compile skipped: %s", e)
    for config in candidates:
        with contextlib.suppress(Exception):  # a failure is scored when it is measured
            task.warmup(config)
    return report


def measurer(
    task: TuneTask,
    failures: dict[KernelConfig, str],
    *,
    timer: Timer,
    lockstep: Lockstep,
    holder: Holder | None = None,
) -> Callable[[KernelConfig, int], Measurement]:
    """The search's ``measure(config, repetitions)``: on every rank, the config's first
    launch checked, then timed on ``timer`` (every repetition started together); a
    failure on any rank scores it ``inf`` with its reason kept in ``failures``. Rank 0's
    ``holder`` is checked after each: lost, every rank raises :class:`LockLost`."""
    checked: set[KernelConfig] = set()
    timed = timer  # one process: nobody to start with (and a timer of two arguments)
    if lockstep.active:

        def meet() -> None:
            lockstep.meet(what="start of a repetition")

        steps: dict[str, Any] = {"meet": meet}
        if _takes(timer, "align"):  # a timer of before align (a user's) does without
            steps["align"] = lockstep.align
        timed = functools.partial(timer, **steps)

    def measure(config: KernelConfig, repetitions: int) -> Measurement:
        lockstep.barrier(what=f"start of {config.label()}")
        times, reason = [math.inf] * repetitions, failures.get(config)
        if reason is None:
            try:
                if config not in checked:  # the first launch is checked
                    reason = task.verify(task.run(config))
                    checked.add(config)
                if reason is None:
                    times = timed(lambda: task.run(config), repetitions)
            except RankFailure:  # a peer died or hangs: no config's fault, and the
                raise  # ranks' collectives would no longer match
            except Exception as e:  # compile, launch or resource failure: inf, reason kept
                reason = named(e)
        loss = holder.loss if holder is not None else None  # no call: the heartbeat's view
        flags = lockstep.max_over_ranks(  # the loss rides on the times' own collective
            [0.0 if reason is None else 1.0, 0.0 if loss is None else 1.0, *times],
            what=f"times of {config.label()}",
        )
        if flags[1] > 0:
            _stopped(holder, loss)
        if flags[0] > 0:
            failures.setdefault(config, reason or "failed on another rank")
            return Measurement(config, error=failures[config])
        return summarize(config, flags[2:])

    return measure


def _stopped(holder: Holder | None, loss: str | None) -> None:
    """The search stops: rank 0's lock was lost. Rank 0 says how long after the loss."""
    if holder is None or holder.lease is None or loss is None:  # a rank other than 0
        raise LockLost("the fleet lock", "lost on rank 0")
    seen = holder.lease.lost_at
    late = "" if seen is None else f", {time.monotonic() - seen:.3f} s after the loss was seen"
    log.warning("lock %s lost while tuning: the search stops%s", holder.lease.name, late)
    raise LockLost(holder.lease.name, loss)


def _check_winner(task: TuneTask, best: KernelConfig, lockstep: Lockstep) -> None:
    try:
        reason = task.verify(task.run(best))
    except Exception as e:
        reason = named(e)
    flag = lockstep.max_over_ranks([0.0 if reason is None else 1.0], what="winner check")
    if flag[0] > 0:
        raise TuneError(
            f"{task.kernel} at {task.key()}: the winner {best.label()} failed "
            f"its check ({reason or 'on another rank'}); nothing stored."
        )


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` names a parameter ``name`` (a ``**kwargs`` wrapper does not count:
    it may pass the keyword on to a timer that does not take it)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: assume the old one
        return False
    return any(p.name == name and p.kind is not p.VAR_POSITIONAL for p in parameters)
