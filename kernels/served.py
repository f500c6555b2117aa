"""What every served layer does alike (:class:`kernels.adapter.Served`), written once.

A kernel's served layer subclasses :class:`ServedLayer` and states only what is its own:
its call, its launch plan, its default config, and, for a kernel of many ranks, its
group and world. Every kernel here serves a layer ``x @ w`` (:class:`Layer`: ``w`` is
``[K, N]``), so the scratch inputs of a rehearsal and the meta tensors of a warm-up
plan are made here. Imports torch: a served layer runs a kernel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from kernels import collectives, startup
from kernels.adapter import KernelAdapter, LaunchPlan, Layer, torch_dtype
from registry.core.config import KernelConfig


class ServedLayer(ABC):
    """One layer served by one kernel. The defaults are those of one process: a subclass
    of many ranks sets ``group``, ``world``, ``rows_step`` and ``collective``, and then
    :meth:`agree` and :meth:`all_true` are collectives over that group."""

    adapter: ClassVar[KernelAdapter]  # the kernel's adapter: a call's key is its key
    kernel: str  # the kernel's name, as kernels.ADAPTERS lists it
    rows_step = 1  # a call's M is a multiple of this (the world size for a gather)
    collective = False  # calls are collectives: every rank must run the same algorithm
    group: Any = None  # the process group its calls span; None: this process alone
    world = 1  # the ranks of that group

    def __init__(self, layer: Layer, *, device: Any) -> None:
        self.layer, self.device = layer, torch.device(device)
        self.dtype = torch_dtype(layer.dtype)

    @abstractmethod
    def __call__(
        self, config: KernelConfig, a: torch.Tensor, b: torch.Tensor, /, *, out: Any = None
    ) -> torch.Tensor:
        """Run the layer's kernel with ``config`` on ``a: [rows/world, K]`` and the
        layer's ``b: [K, N]``; the kernel checks its inputs."""

    @abstractmethod
    def plan(
        self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig
    ) -> LaunchPlan:
        """What a call on ``a`` (gathered: every rank's rows) and ``b`` into ``out`` with
        ``config`` launches (a fused kernel's; no library algorithm has one)."""

    @abstractmethod
    def default_config(self) -> KernelConfig:
        """The config a layer with no tuned entry falls back to."""

    def key(self, m: int) -> dict[str, Any]:
        """The registry key of a call with ``m`` rows."""
        layer = self.layer
        return self.adapter.key(m=m, n=layer.n, k=layer.k, dtype=layer.dtype, world=self.world)

    def rows(self, a: torch.Tensor, b: torch.Tensor, /) -> int:
        """The M of a call: ``a``'s rows from each of ``rows_step`` ranks."""
        return int(a.shape[0]) * self.rows_step

    def warm_up_plan(self, config: KernelConfig) -> LaunchPlan:
        """A launch plan on meta tensors, one row per rank: the specialisation of an
        aligned real call, no memory, nothing launched."""
        rows, n, k = self.rows_step, self.layer.n, self.layer.k
        a, b, out = (
            torch.empty(*shape, dtype=self.dtype, device="meta")
            for shape in ((rows, k), (k, n), (rows, n))
        )
        return self.plan(a, b, out, config)

    def prepare(self, config: KernelConfig, rows: Sequence[int]) -> None:
        """One variant serves every M: compiled or loaded once, its GPU module loaded
        (the interpreter compiles nothing)."""
        if self.device.type == "cuda":
            self.warm_up_plan(config).load()

    def rehearse(self, configs: Sequence[KernelConfig]) -> None:
        """One call per config on one row per rank of scratch inputs, waited for."""
        with startup.phase("rehearse"):
            self._rehearse(configs)

    def _rehearse(self, configs: Sequence[KernelConfig]) -> None:
        a = torch.randn(1, self.layer.k, dtype=self.dtype, device=self.device)
        b = torch.randn(self.layer.k, self.layer.n, dtype=self.dtype, device=self.device)
        for config in configs:
            self(config, a, b)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def agree(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank of the group (a collective; one process: its
        own)."""
        return collectives.agree(value, group=self.group, world=self.world)

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` is true on every rank of the group (a collective; one
        process: its own word)."""
        return collectives.all_true(flag, group=self.group, world=self.world, device=self.device)
