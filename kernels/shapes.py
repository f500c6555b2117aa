"""Which manifest shapes each kernel takes, known without importing the kernel.

A manifest is checked where torch and triton are not imported (``triton-warmup
validate``, the launcher before its ranks start, the sidecar), so each kernel's rule on
its shapes lives here, beside :data:`kernels.ADAPTERS`, as data: every kernel there has
one rule here, and its adapter's ``check_shape`` is that rule, read from here (one rule
and one message; ``tests/warmup/core/test_manifest.py`` checks both). Imports only the
standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ShapeRule:
    """What a kernel asks of a shape. ``rows_per_rank``: M is gathered from equal shares
    of every rank (an AllGather), so it is a multiple of the world size."""

    rows_per_rank: bool = False

    @property
    def restricts(self) -> bool:
        """Whether any shape can be refused (a rule that cannot is not run)."""
        return self.rows_per_rank

    def check(self, shape: Mapping[str, int], *, world_size: int) -> str | None:
        """None when the kernel takes ``shape`` on ``world_size`` ranks, else why not."""
        if self.rows_per_rank and shape["M"] % world_size:
            return f"M={shape['M']} is not a multiple of world_size {world_size}"
        return None


RULES: dict[str, ShapeRule] = {
    "ag_gemm": ShapeRule(rows_per_rank=True),
    "matmul": ShapeRule(),  # every rank runs the whole problem: any sizes
}


def check_shape(kernel: str, shape: Mapping[str, int], *, world_size: int) -> str | None:
    """Kernel ``kernel``'s verdict on ``shape`` (None: taken); KeyError for an unknown kernel."""
    return RULES[kernel].check(shape, world_size=world_size)
