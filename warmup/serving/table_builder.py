"""A serving op's tables, built: every config of a table compiled or loaded (its GPU module
loaded) for the Ms it serves before the table is ever swapped in, so no call builds one.

A layer with no tuned entry gets the kernel's default config at every M, counted as a
fallback. A config built already for an M is not built again: a new generation that keeps
most configs costs only its new ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from kernels.adapter import Layer, Served
from registry import KernelConfig
from warmup.serving.table import FALLBACK, Table, nearest_table


class TableBuilder:
    """Makes the tables of one served layer and builds their configs, remembering which
    config was built for which M."""

    def __init__(self, served: Served, layer: Layer) -> None:
        self.served, self.layer, self.step = served, layer, served.rows_step
        self._prepared: dict[KernelConfig, set[int]] = {}  # config -> the Ms it was built for

    def table(self, tuned: Mapping[int, KernelConfig]) -> Table:
        """The table of ``tuned`` (the default config everywhere when it is empty), not
        built yet."""
        limit = self.layer.max_m // self.step
        if not tuned:
            default = self.served.default_config()
            return Table((), (default,), [0] * (limit + 1), [FALLBACK] * (limit + 1))
        return nearest_table(tuned, step=self.step, max_m=self.layer.max_m)

    def built(self, tuned: Mapping[int, KernelConfig]) -> Table:
        """The table of ``tuned`` with every config built for the Ms it serves."""
        new = self.table(tuned)
        self.prepare(new)
        return new

    def prepare(self, table: Table) -> None:
        """Build every config of ``table`` for the Ms it serves there and has not been
        built for yet, on the served layer's device."""
        import torch  # torch loads on first use

        rows: list[list[int]] = [[] for _ in table.configs]  # config slot -> the Ms it serves
        for index, slot in enumerate(table.pick[1:], start=1):
            rows[slot].append(index * self.step)
        on_gpu = self.served.device.type == "cuda"  # Triton builds for the thread's device
        with torch.cuda.device(self.served.device) if on_gpu else contextlib.nullcontext():
            for config, ms in zip(table.configs, rows, strict=True):
                done = self._prepared.get(config)
                new = [m for m in ms if done is None or m not in done]
                if done is None or new:  # built already, for these Ms: nothing to do
                    self.served.prepare(config, new)
                    self._prepared.setdefault(config, set()).update(new)
