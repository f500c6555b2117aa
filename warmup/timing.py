"""Timers for the tuner, injected like Triton's ``do_bench=``: a timer runs a thunk
``repetitions`` times and returns each repetition's time in milliseconds.

``cuda_event_timer``: device events, warm-up, L2 flushed before every repetition, CUDA
graph replay for kernels too short to time one launch at a time. ``wall_clock_timer``:
the host clock, for the CPU interpreter (tests, demo). Tests inject fakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

Thunk = Callable[[], Any]


class Timer(Protocol):
    def __call__(self, fn: Thunk, repetitions: int) -> list[float]: ...


def wall_clock_timer(*, warmup: int = 1) -> Timer:
    """Host time per repetition (the interpreter runs synchronously on the CPU)."""

    def timer(fn: Thunk, repetitions: int) -> list[float]:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repetitions):
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
    """Device-event timing with the L2 flushed before each repetition.

    A kernel whose first timed launch takes under ``graph_below_ms`` is captured in a CUDA
    graph of ``graph_batch`` launches and timed per replay (launch gaps would dominate);
    kernels that cannot be captured fall back to single launches.
    """
    import torch

    flush = torch.empty(flush_bytes, dtype=torch.int8, device="cuda")

    def one(fn: Thunk) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        flush.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def timer(fn: Thunk, repetitions: int) -> list[float]:
        for _ in range(warmup):
            fn()
        first = one(fn)
        if first < graph_below_ms:
            graphed = _graph_times(fn, repetitions, graph_batch, flush)
            if graphed is not None:
                return graphed
        return [first] + [one(fn) for _ in range(repetitions - 1)]

    return timer


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
