"""Fake tasks and timers: the tuner's search is tested with known timings."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from kernels.task import Task
from registry import KernelConfig


def configs(*blocks: int) -> list[KernelConfig]:
    return [KernelConfig.make({"BLOCK": b}) for b in blocks]


@dataclass
class FakeTask(Task):
    """A kernel whose configs take known times; some fail to launch or give wrong output."""

    timings: dict[int, float]  # BLOCK -> ms
    m: int = 1024
    broken: dict[int, str] = field(default_factory=dict)  # BLOCK -> launch error
    wrong: set[int] = field(default_factory=set)  # BLOCK whose output is wrong
    sleep_s: float = 0.0  # per launch, to make tuning take a while
    die_at_launch: int | None = None  # SIGKILL this process at that launch
    kernel: str = "fake_gemm"
    baseline_block: int | None = None  # the config that stands for what the op replaces
    launches: int = 0
    last: int | None = None
    drops: int = 0  # drop_inputs() calls
    remakes: int = 0  # remake_inputs() calls that had inputs to make
    holding: bool = True  # its "inputs": run() refuses without them

    @property
    def kernel_hash(self) -> str:
        return "f" * 64

    def key(self) -> dict[str, Any]:
        return {"M": self.m, "dtype": "bf16"}

    def candidates(self) -> list[KernelConfig]:
        return configs(*self.timings)

    def baseline(self) -> KernelConfig | None:
        return None if self.baseline_block is None else configs(self.baseline_block)[0]

    def drop_inputs(self) -> None:
        self.drops += 1
        self.holding = False

    def remake_inputs(self) -> None:
        if not self.holding:
            self.remakes += 1
            self.holding = True

    def run(self, config: KernelConfig) -> str:
        assert self.holding, "run after drop_inputs() without remake_inputs()"
        self.launches += 1
        if self.die_at_launch is not None and self.launches >= self.die_at_launch:
            os.kill(os.getpid(), signal.SIGKILL)
        block = config.meta["BLOCK"]
        assert isinstance(block, int)
        if block in self.broken:
            raise RuntimeError(self.broken[block])
        time.sleep(self.sleep_s)
        self.last = block
        return "wrong" if block in self.wrong else "right"

    def verify(self, output: str) -> str | None:
        return None if output == "right" else "differs from the reference"

    def warmup(self, config: KernelConfig) -> None:
        return None


def fake_timer(  # type: ignore[no-untyped-def]
    task: FakeTask, *, scale: float = 1.0, spread: dict[int, float] | None = None
):
    """Runs the thunk once (so the task records its config), reports the known time,
    spread evenly by +-``spread[BLOCK]`` (a fraction) over the repetitions; runs ``meet``
    and ``align`` before each repetition, as a real timer does, and counts them."""
    calls = []

    def timer(fn, repetitions, meet=None, align=None):  # type: ignore[no-untyped-def]
        fn()
        calls.append(repetitions)
        for _ in range(repetitions if meet is not None else 0):
            meet()
            timer.meetings += 1  # type: ignore[attr-defined]
        for _ in range(repetitions if align is not None else 0):
            align()
            timer.alignments += 1  # type: ignore[attr-defined]
        ms, width = task.timings[task.last] * scale, (spread or {}).get(task.last, 0.0)
        if repetitions == 1 or not width:
            return [ms] * repetitions
        return [ms * (1 - width + 2 * width * i / (repetitions - 1)) for i in range(repetitions)]

    timer.calls = calls  # type: ignore[attr-defined]
    timer.meetings = 0  # type: ignore[attr-defined]
    timer.alignments = 0  # type: ignore[attr-defined]
    return timer
