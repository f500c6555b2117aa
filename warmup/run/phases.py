"""Time to ready, by phase: where a run's seconds went.

A rank adds up its own phases (``PhaseClock``) and writes them in its report; the
launcher adds its own and :func:`run_phases` folds them into the status: the slowest
rank's seconds for each rank phase, since a run is ready when its slowest rank is.
``restore`` runs in the launcher while the ranks start, so it overlaps ``rank_start``
and has no share of the run of its own (on a full hit, no rank starts: it has one);
``rendezvous`` holds what the ranks still waited for it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

T = TypeVar("T")

# a phase -> the phase it runs beside: while that one is there, not added to the total
OVERLAPPING = {"restore": "rank_start"}  # the launcher restores while the ranks start
# name -> what it holds, in the order a run goes through them
PHASES: dict[str, str] = {
    "imports": "process start, imports and checks, until the ranks start",
    "restore": "registry recovery and compile-cache restore from the volume",
    "rank_start": "rank processes: start and imports (overlaps restore)",
    "rendezvous": "GPU context, process group, waiting for the restore, first barrier",
    "prepare": "fingerprint, registry, tuners, the pod's place in the shape order",
    "setup": "workspaces (symmetric memory) and inputs of every shape",
    "lookup": "registry lookups that found a config (local, then remote)",
    "tune": "tuning the shapes this pod took: compile, time, check, store",
    "compile": "stored configs: compile or load from the compile cache",
    "check": "stored configs: first launch and check against the reference",
    "lock_wait": "waiting on shapes that other pods were tuning",
    "models": "compiled models: artifact restore, torch.compile and first calls, store",
    "exit": "the rank processes' exit after their reports, as the launcher waits",
    "settle": "compiled models that tuned at run time, again in fresh rank processes",
    "save": "compile-cache save, autotune import, status",
}


class PhaseClock:
    """Seconds per phase, added up as the run goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        assert phase in PHASES, phase
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)

    def timed_items(self, phase: str, items: Iterable[T]) -> Iterator[T]:
        """``items``, each one's making (a lazy iterable's ``next``) added to ``phase``."""
        iterator = iter(items)
        while True:
            with self.timing(phase):
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item


def process_age() -> float:
    """Seconds since this process started (its start time in ``/proc``); 0.0 where
    there is no ``/proc``."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / ticks)  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return 0.0


def run_phases(
    launcher: Mapping[str, float], ranks: Iterable[Mapping[str, float]]
) -> dict[str, float]:
    """The run's phases, in :data:`PHASES` order: the launcher's own, and those of the
    slowest rank (the most seconds in all). Not each phase's slowest rank: a rank that
    starts late makes its peers wait at the rendezvous, and both would count."""
    slowest = max(ranks, key=lambda phases: sum(_counted(phases).values()), default={})
    merged = {**slowest, **launcher}
    return {name: round(merged[name], 4) for name in PHASES if name in merged}


def _beside(phases: Mapping[str, float]) -> dict[str, str]:
    """The phases of ``phases`` that ran beside another one of them, each with that one."""
    return {n: other for n, other in OVERLAPPING.items() if n in phases and other in phases}


def _counted(phases: Mapping[str, float]) -> dict[str, float]:
    beside = _beside(phases)
    return {name: s for name, s in phases.items() if name not in beside}


def phase_table(phases: Mapping[str, float], total_s: float | None) -> list[str]:
    """The phases as table lines: seconds, share of the run, what each holds; ``other``
    is what no phase holds (the launcher's polling). The shares add up to 100 %: a phase
    that ran beside another (the restore, while the ranks start) has no share of its
    own, and where the phases add up to more than the run (the ranks' clocks and the
    launcher's), the shares are of their sum, as a last line says."""
    beside = _beside(phases)
    counted = sum(_counted(phases).values())
    rows = [(name, seconds, PHASES.get(name, "")) for name, seconds in phases.items()]
    if total_s is not None:
        rows.append(("other", max(0.0, total_s - counted), "in no phase above"))
    whole = max(total_s, counted) if total_s is not None else 0.0
    lines = [f"{'phase':<11} {'seconds':>8} {'share':>6}  what"]
    for name, seconds, what in rows:
        share = f"{100 * seconds / whole:5.1f}%" if whole else ""
        if name in beside:
            share, what = "beside", f"{what} (beside {beside[name]}: no share of its own)"
        lines.append(f"{name:<11} {seconds:8.2f} {share:>6}  {what}")
    if total_s is not None:
        lines.append(f"{'total':<11} {total_s:8.2f} {'':>6}  time to ready")
    if total_s is not None and counted > total_s:
        lines.append(
            f"(the phases add up to {counted:.2f} s, more than the run's {total_s:.2f} s: "
            "shares are of their sum)"
        )
    return lines
