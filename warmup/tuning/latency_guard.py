"""The latency guard: the search's winner against the baseline once more, each call
issued just in time.

The device clock (:mod:`warmup.tuning.timing`) times a call with the host ahead, but a
call issued just in time (eager serving, no graph) also waits for the host to issue it,
and an algorithm that launches its main kernel last, after more host work than the
baseline's, can lose there what it wins on the device. On 2 H200s at 3072 x 2560 x 8192
the fused op's device time was 0.76x the baseline's, its host time 1.7x, and the op 1.05x
slower eager.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
from typing import Any

from kernels.task import TuneTask
from registry import KernelConfig
from warmup.core.collectives import Lockstep, RankFailure
from warmup.tuning.search import SearchResult
from warmup.tuning.timing import Timer

log = logging.getLogger(__name__)
LATENCY_PASSES = 4  # the latency guard's interleaved passes over the winner and baseline
LATENCY_REPETITIONS = 8  # ... and repetitions per pass


def latency_guard(
    task: TuneTask,
    search: SearchResult,
    baseline: KernelConfig | None,
    *,
    timer: Timer | None,
    lockstep: Lockstep,
) -> list[str]:
    """The search's winner, if it is not the baseline, against the baseline once more
    on ``timer``'s clock, a call issued just in time (every rank alike, in
    :data:`LATENCY_PASSES` interleaved passes). Unless the winner's median latency is
    below the baseline's, the baseline is put first in ``search`` (its device time is
    what is recorded). No ``timer``, no baseline among the measured or a baseline that
    won: nothing to do. Returns a note of what it decided."""
    best = search.best
    held = next((m for m in search.measurements if m.config == baseline and m.ok), None)
    if timer is None or held is None or best is held or not best.ok:
        return []
    steps: dict[str, Any] = {}
    if lockstep.active:
        steps["meet"] = functools.partial(lockstep.meet, what="latency")
    pair = (best.config, held.config)
    runs: dict[KernelConfig, list[float]] = {config: [] for config in pair}
    for index in range(LATENCY_PASSES):
        for config in pair[index % 2 :] + pair[: index % 2]:
            try:
                times = timer(functools.partial(task.run, config), LATENCY_REPETITIONS, **steps)
            except RankFailure:
                raise
            except Exception as e:  # every rank still takes part in the max below
                log.warning("%s: latency guard: %s failed: %s", task.kernel, config, e)
                times = [math.inf] * LATENCY_REPETITIONS
            runs[config] += lockstep.max_over_ranks(times, what="latencies")
    if any(math.isinf(t) for times in runs.values() for t in times):
        return ["latency guard: a call failed on some rank; the search's order kept"]
    winner, kept = (statistics.median(runs[config]) * 1e3 for config in pair)
    figures = (
        f"{best.config.label()} {winner:.0f} us against the baseline's {kept:.0f} us "
        f"issued just in time (device time {best.median_ms * 1e3:.0f} against "
        f"{held.median_ms * 1e3:.0f} us)"
    )
    if winner < kept:
        return [f"latency guard: kept {figures}"]
    search.measurements = [held] + [m for m in search.measurements if m is not held]
    log.info("%s %s: latency guard: the baseline first: %s", task.kernel, task.key(), figures)
    return [f"latency guard: the baseline first: {figures}"]
