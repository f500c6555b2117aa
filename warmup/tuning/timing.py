"""Timers for the tuner, injected like Triton's ``do_bench=``: a timer runs a thunk
``repetitions`` times and returns each repetition's time in milliseconds.

A repetition is timed as a call runs in serving: for a collective the tuner passes
``meet``, which every rank runs before every repetition, so the ranks start each one
together and the wait for the slowest rank inside the op is part of its time; then the
L2 is flushed (the host issues the call while the device flushes: a serving host runs
ahead of its GPU, by about that much) and device events bracket the call, the side
streams and events it sets up included.

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
        self, fn: Thunk, repetitions: int, *, meet: Thunk | None = None
    ) -> list[float]: ...


def wall_clock_timer(*, warmup: int = 1) -> Timer:
    """Host time per repetition (the interpreter runs synchronously on the CPU)."""

    def timer(fn: Thunk, repetitions: int, *, meet: Thunk | None = None) -> list[float]:
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
) -> Timer:
    """Device-event timing, the L2 flushed before each repetition (see the module
    docstring; ``meet`` runs first, on an idle device).

    A single-GPU kernel whose first timed launch takes under ``graph_below_ms`` is
    captured in a CUDA graph of ``graph_batch`` launches and timed per replay (launch gaps
    would dominate); kernels that cannot be captured fall back to single launches. A
    collective (``meet`` given) is never graphed: it serves one call at a time.
    """
    import torch

    flush = torch.empty(flush_bytes, dtype=torch.int8, device="cuda")

    def timer(fn: Thunk, repetitions: int, *, meet: Thunk | None = None) -> list[float]:
        for _ in range(warmup):
            fn()
        first = _event_time(fn, meet, flush)
        if first < graph_below_ms and meet is None:
            graphed = _graph_times(fn, repetitions, graph_batch, flush)
            if graphed is not None:
                return graphed
        return [first] + [_event_time(fn, meet, flush) for _ in range(repetitions - 1)]

    return timer


def _event_time(fn: Thunk, meet: Thunk | None, flush: Any) -> float:
    """One launch timed by device events: ``meet`` first, then the L2 flushed."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    if meet is not None:
        meet()  # the device is idle (the last repetition was waited for): start together
    flush.zero_()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def _graph_times(fn: Thunk, repetitions: int, batch: int, flush: Any) -> list[float] | None:
    import torch

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
