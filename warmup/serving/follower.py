"""The ops a serving process made, kept current: the registry followed on a thread, every
op's new table swapped in when this rank may take it alone (or at a sync, when the ranks
take it together), and the ops' calls written to this process's metrics file.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from registry import Store
from warmup.serving.compile_guard import CompileGuard
from warmup.serving.metrics import ServingMetrics
from warmup.serving.serving_op import ServingOp
from warmup.serving.table import SOURCES

log = logging.getLogger("warmup.serving.ops")  # the name these logs had: filters hold
METRICS_EVERY_S = 10.0  # how often the follower rewrites the metrics file


def exempt(guard: CompileGuard | None) -> AbstractContextManager[Any]:
    """Builds made by the op's owner (construction, follower) are not request compiles."""
    return guard.exempt() if guard is not None else contextlib.nullcontext()


class Follower:
    """Every op of one :class:`~warmup.serving.ops.Serving`, and the thread that follows
    the registry for them every ``refresh_s`` (started by :meth:`start`)."""

    def __init__(
        self,
        store: Store,
        metrics: ServingMetrics,
        *,
        metrics_dir: Path,
        refresh_s: float,
        guard: CompileGuard | None,
    ) -> None:
        self.store, self.metrics, self.guard = store, metrics, guard
        self.metrics_dir, self.refresh_s = metrics_dir, refresh_s
        self.ops: list[ServingOp] = []
        self._exported: dict[tuple[int, int], int] = {}  # (op, source) -> calls exported
        self._lock = threading.RLock()  # ops list and table swaps: the follower vs keep()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Follow the registry on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._follow, name="triton-warmup-follower")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (if started), waiting for its current refresh."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def keep(self, make: Callable[[], ServingOp]) -> ServingOp:
        """The op ``make`` makes (exempt from the compile guard, no refresh meanwhile),
        followed from now on."""
        with self._lock, exempt(self.guard):
            op = make()
            self.ops.append(op)
        return op

    def refresh(self) -> int:
        """Check the registry now and swap in every op's new table that this rank may
        take alone; returns how many swapped. Not a collective."""
        with self._lock, exempt(self.guard):
            self.store.refresh()
            return self._counted([self._refreshed(op) for op in self.ops])

    def sync(self) -> int:
        """Every collective op takes rank 0's table (a collective each, in the order the
        ops were made, whether anything changed or not); the others refresh. Returns how
        many ops swapped."""
        with self._lock, exempt(self.guard):
            try:
                self.store.refresh()
            except Exception:  # every collective op must still take part below
                log.exception("serving sync: the registry could not be refreshed")
            swapped = [
                op.sync() if op.collective else self._refreshed_safely(op) for op in self.ops
            ]
            return self._counted(swapped)

    def flush_metrics(self) -> None:
        """Export the ops' call counts and pending tables, and write this process's
        metrics file."""
        with self._lock:
            pending: dict[str, int] = {}
            for op in self.ops:
                pending[op.kernel] = pending.get(op.kernel, 0) + (op.pending is not None)
            for kernel, count in pending.items():
                self.metrics.pending_tables.labels(kernel, self.metrics.rank).set(count)
            for number, op in enumerate(self.ops):
                for source, count in enumerate(list(op.calls)):
                    delta = count - self._exported.get((number, source), 0)
                    if delta:
                        labels = (op.kernel, SOURCES[source], self.metrics.rank)
                        self.metrics.calls.labels(*labels).inc(delta)
                        self._exported[(number, source)] = count
        try:
            self.metrics.write(self.metrics_dir)
        except OSError as e:
            log.warning("could not write the serving metrics file: %s", e)

    def _follow(self) -> None:
        flushed = time.monotonic()
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception:  # the follower must outlive a bad generation
                log.exception("serving follower: refresh failed; keeping the current tables")
            if time.monotonic() - flushed >= METRICS_EVERY_S:  # a file write: not every tick
                self.flush_metrics()  # also, and above all, when refreshes fail
                flushed = time.monotonic()

    def _refreshed_safely(self, op: ServingOp) -> bool:
        """A one-device op's refresh inside a sync: its failure must not stop the
        collective ops after it from taking part (their peers would wait)."""
        try:
            return self._refreshed(op)
        except Exception:
            log.exception("serving sync: %s %s could not refresh", op.kernel, op.layer)
            return False

    def _refreshed(self, op: ServingOp) -> bool:
        """Whether ``op`` swapped; an op built from these very files is not rebuilt."""
        return op.version != self.store.version and op.refresh()

    def _counted(self, swapped: list[bool]) -> int:
        for op, swap in zip(self.ops, swapped, strict=True):
            if swap:
                self.metrics.generation_swaps.labels(op.kernel, self.metrics.rank).inc()
        return sum(swapped)
