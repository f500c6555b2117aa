"""Where a served layer's start goes: named phases that the start-up code times only
while a caller records (``bench/op_start.py``), and counts of what it made.

    with startup.recording() as record:          # this thread, and nothing it started
        op = serving.op("ag_gemm", ...)
    record.seconds   # {"workspace.rendezvous": 0.41, "prime.gemms": 2.3, ...}
    record.counts    # {"workspace.rendezvous": 1, "workspace.reused": 1, ...}

Start-up code wraps its steps in ``with startup.phase("name"):`` and notes events with
:func:`count`; outside a recording both cost a context-variable read. Phases nest: an
inner phase's seconds are also in its outer one's. Nothing here is on a request's path.
Imports neither torch nor triton.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class Record:
    """Seconds and entries per phase name, and counts of events, over one recording."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, dict[str, float] | dict[str, int]]:
        return {"seconds": dict(self.seconds), "counts": dict(self.counts)}


# a context variable: a thread the recorder did not start (the follower's) records nothing
_RECORD: ContextVar[Record | None] = ContextVar("triton_warmup_startup", default=None)


@contextlib.contextmanager
def recording() -> Iterator[Record]:
    """Record the phases and counts of the code run inside, on this thread."""
    record = Record()
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the code inside as phase ``name`` (added up over entries) and count an entry,
    when a recording is on; otherwise do nothing."""
    record = _RECORD.get()
    if record is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        record.seconds[name] = record.seconds.get(name, 0.0) + time.perf_counter() - start
        record.counts[name] = record.counts.get(name, 0) + 1


def count(name: str, by: int = 1) -> None:
    """Count an event (a workspace reused, a GEMM shape primed) when a recording is on."""
    record = _RECORD.get()
    if record is not None:
        record.counts[name] = record.counts.get(name, 0) + by
