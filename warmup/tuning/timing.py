"""Timers for the tuner, injected like Triton's ``do_bench=``: a timer runs a thunk
``repetitions`` times and returns each repetition's time in milliseconds.

A repetition is timed as a call runs in serving: for a collective the tuner passes
``meet``, which every rank runs before every repetition, so the ranks start each one
together and the wait for the slowest rank inside the op is part of its time; then the
L2 is flushed and the device held for a head start (``head_start_us``: a serving host
runs ahead of its GPU, or replays a graph), so that the host has issued the whole call
before the device reaches it, and device events bracket the call, the side streams
and events it sets up included. Without the head start a call whose host time is about
the flush's device time (NCCL + cuBLAS below 1,024 rows on an H200: 40 to 130 us) was
timed at its host's speed some repetitions and its device's others: two modes, 1.5 to
3x apart, which no number of repetitions makes agree with another clock. The host's
own cost is measured apart: ``cuda_latency_timer`` times a call issued just in time,
host and device together (the tuner's guard against a winner that is slower so).

``cuda_event_timer``: device events, warm-up, CUDA graph replay for single-GPU kernels
too short to time one launch at a time. ``wall_clock_timer``: the host clock, for the CPU
interpreter (tests, demo). Tests inject fakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

Thunk = Callable[[], Any]


class Timer(Protocol):
    def __call__(
        self, fn: Thunk, repetitions: int, *, meet: Thunk | None = None, align: Thunk | None = None
    ) -> list[float]: ...


def wall_clock_timer(*, warmup: int = 1) -> Timer:
    """Host time per repetition (the interpreter runs synchronously on the CPU)."""

    def timer(
        fn: Thunk, repetitions: int, *, meet: Thunk | None = None, align: Thunk | None = None
    ) -> list[float]:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repetitions):
            if meet is not None:
                meet()
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times

    return timer


def cuda_event_timer(
    *,
    warmup: int = 2,
    flush_bytes: int = 256 * 2**20,
    graph_below_ms: float = 0.02,
    graph_batch: int = 20,
    head_start_us: float = 400.0,
) -> Timer:
    """Device-event timing, the L2 flushed and the device held for ``head_start_us``
    before each repetition (see the module docstring; ``meet`` runs first, on an idle
    device; 0: no hold).

    A single-GPU kernel whose first timed launch takes under ``graph_below_ms`` is
    captured in a CUDA graph of ``graph_batch`` launches and timed per replay (launch gaps
    would dominate); kernels that cannot be captured fall back to single launches. A
    collective (``meet`` given) is never graphed: it serves one call at a time.
    """
    import torch  # torch loads on first use

    flush = torch.empty(flush_bytes, dtype=torch.int8, device="cuda")
    hold = DeviceHold(head_start_us)

    def timer(
        fn: Thunk, repetitions: int, *, meet: Thunk | None = None, align: Thunk | None = None
    ) -> list[float]:
        for _ in range(warmup):
            fn()
        steps = (meet, flush, hold, align)
        first = _event_time(fn, *steps)
        if first < graph_below_ms and meet is None:
            graphed = _graph_times(fn, repetitions, graph_batch, flush)
            if graphed is not None:
                return graphed
        return [first] + [_event_time(fn, *steps) for _ in range(repetitions - 1)]

    return timer


def cuda_latency_timer(*, warmup: int = 2, flush_bytes: int = 256 * 2**20) -> Timer:
    """Device-event timing of a call issued just in time: the L2 flushed, then (``meet``)
    every rank's host released together on an idle device, and the events bracket the
    host's issue of the call as well as the device's work: what a call costs when the
    host is not ahead of the GPU (eager serving of one layer at a time). The tuner's
    guard compares its winner with the baseline on this clock (``warmup.tuning.latency_guard``)."""
    import torch  # torch loads on first use

    flushes: list[Any] = []  # made at the first use: the tuner's guard needs it rarely

    def timer(
        fn: Thunk, repetitions: int, *, meet: Thunk | None = None, align: Thunk | None = None
    ) -> list[float]:
        for _ in range(warmup):
            fn()
        if not flushes:
            flushes.append(torch.empty(flush_bytes, dtype=torch.int8, device="cuda"))
        return [
            _event_time(fn, meet, flushes[0], NO_HOLD, None, just_in_time=True)
            for _ in range(repetitions)
        ]

    return timer


class DeviceHold:
    """Keeps the current stream busy for about ``microseconds`` (a spinning kernel of
    one thread), so that the host issues what follows before the device reaches it.
    Calibrated at its first use: the GPU's cycles per microsecond, from one spin timed
    by events."""

    def __init__(self, microseconds: float) -> None:
        self.microseconds = microseconds
        self._cycles = 0  # 0: not calibrated yet

    def __call__(self) -> None:
        import torch  # torch loads on first use

        if self.microseconds <= 0:
            return
        if not self._cycles:
            self._cycles = max(1, int(self.microseconds * _cycles_per_us()))
        torch.cuda._sleep(self._cycles)  # type: ignore[no-untyped-call]


NO_HOLD = DeviceHold(0.0)


def _cycles_per_us(cycles: int = 2_000_000) -> float:
    """The current GPU's spin cycles per microsecond (about its clock in MHz)."""
    import torch  # torch loads on first use

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    torch.cuda._sleep(cycles // 10)  # type: ignore[no-untyped-call]  # clocks up
    start.record()
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
    end.record()
    end.synchronize()
    return cycles / max(1.0, float(start.elapsed_time(end)) * 1e3)


def _event_time(
    fn: Thunk,
    meet: Thunk | None,
    flush: Any,
    hold: DeviceHold,
    align: Thunk | None,
    *,
    just_in_time: bool = False,
) -> float:
    """One launch timed by device events: ``meet`` first, then the L2 flushed, the
    device held while the host issues the call, and (``align``) the ranks' streams met
    on the devices, so that every rank's call starts within microseconds of the others'
    whatever each one's flush and hold took. ``just_in_time``: the L2 flushed first,
    then ``meet`` (one process: the device waited for), so that the call starts on an
    idle device and the events bracket its host's issue too."""
    import torch  # torch loads on first use

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    if just_in_time:
        flush.zero_()
    if meet is not None:
        meet()  # the device is idle (the last repetition was waited for): start together
    elif just_in_time:
        torch.cuda.synchronize()
    if not just_in_time:
        flush.zero_()
    hold()
    if align is not None:
        align()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def _graph_times(fn: Thunk, repetitions: int, batch: int, flush: Any) -> list[float] | None:
    import torch  # torch loads on first use

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(batch):
                fn()
    except Exception:  # not capturable (host syncs, collectives): time launches instead
        torch.cuda.synchronize()
        return None
    times = []
    for _ in range(repetitions):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) / batch)
    return times
