"""Progress of the compiled models' warm, told while it runs: each model's restore, each
build, each shape's first call (compiled, or loaded from the restored cache) and its end,
with the time since the model began.

The warm tells a :data:`ModelProgress` callback (``warm_models(progress=...)``): rank 0's
run passes :func:`model_progress_printer`, a test a list's ``append``. Nothing deeper
prints: a compile of 20 s is no longer 20 s of silence.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger(__name__)

Kind = Literal["restore", "build", "shape", "done"]
BAR_WIDTH = 24
LINE_WIDTH = 72  # a terminal's line: what follows the bar, padded so a shorter one clears it


@dataclass(frozen=True)
class ModelStep:
    """One step of one model's warm on this rank: its stored artifacts looked up
    (``restore``), the user's ``build`` called, one shape's first call (``shape``), or the
    model's end (``done``)."""

    model: str
    kind: Kind
    elapsed: float  # the model's seconds so far: its build, then its turn after the kernels
    seconds: float = 0.0  # the build's (before the kernels), a shape's call, the restore's
    index: int = 0  # shape: its place, from 1; done: the shapes that ran
    total: int = 0  # the model's shapes: declared, then learned
    dims: Mapping[str, int] = field(default_factory=dict)
    compiles: int = 0  # shape: graphs Inductor compiled and Triton kernels, at this call
    cache_hits: int = 0  # shape: FX graphs loaded from the cache at this call
    what: str = ""  # restore: 'hit' or 'miss: why'; done: the phase, or the error
    failed: bool = False  # done: the model failed

    def describe(self) -> str:
        """One line: ``model mlp: shape 2/4 (batch=8) compiled in 3.1 s, 9.8 s so far``."""
        head = f"model {self.model}"
        if self.kind == "restore":
            return f"{head}: restore: {self.what} ({self.seconds:.1f} s)"
        if self.kind == "build":
            return f"{head}: built in {self.seconds:.1f} s, {self.elapsed:.1f} s so far"
        if self.kind == "shape":
            return (
                f"{head}: shape {self.index}/{self.total} ({_dims(self.dims)}) {self.verb()} "
                f"in {self.seconds:.1f} s, {self.elapsed:.1f} s so far"
            )
        ran = f" after {self.index}/{self.total} shapes" if self.total else ""  # 0: none here
        if self.failed:
            return f"{head}: failed{ran} in {self.elapsed:.1f} s: {self.what}"
        return f"{head}: {self.what}{ran} in {self.elapsed:.1f} s"

    def verb(self) -> str:
        """What the shape's call did: ``compiled``, ``loaded from cache`` or ``ran``."""
        if self.compiles:
            return "compiled"
        return "loaded from cache" if self.cache_hits else "ran"


ModelProgress = Callable[[ModelStep], None]
"""Told each :class:`ModelStep` as it ends; it must not raise."""


def model_progress_printer(stream: Any = sys.stderr) -> ModelProgress:
    """A one-line bar per model on a terminal (``stream``); one log line per step
    otherwise, but the model's end (the runner logs the model's result)."""
    interactive = hasattr(stream, "isatty") and stream.isatty()

    def show(step: ModelStep) -> None:
        if not interactive:
            if step.kind != "done":
                log.info("%s", step.describe())
            return
        line = step.describe() if step.kind != "shape" else _short(step)
        stream.write(f"\r[{_bar(step)}] {line:{LINE_WIDTH}.{LINE_WIDTH}}")
        if step.kind == "done":
            stream.write("\n")
        stream.flush()

    return show


def _short(step: ModelStep) -> str:
    """A shape's step for the bar: ``model mlp 2/4 batch=8 compiled 3.1 s, 9.8 s so far``."""
    return (
        f"model {step.model} {step.index}/{step.total} {_dims(step.dims)} {step.verb()} "
        f"{step.seconds:.1f} s, {step.elapsed:.1f} s so far"
    )


def _bar(step: ModelStep) -> str:
    filled = BAR_WIDTH * step.index // max(step.total, 1)
    return "#" * filled + "." * (BAR_WIDTH - filled)


def _dims(dims: Mapping[str, int]) -> str:
    return " ".join(f"{name}={value}" for name, value in dims.items())
