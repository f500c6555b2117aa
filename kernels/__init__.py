"""The kernels and what is specific to each (its adapter). Adding a kernel: one module
with an ``ADAPTER`` and one line in :data:`ADAPTERS`. Importing this package imports
neither torch nor triton; :func:`adapter_for` imports the kernel's module on first use."""

from __future__ import annotations

import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernels.adapter import Adapter

ADAPTERS: dict[str, str] = {
    "ag_gemm": "kernels.ag_gemm:ADAPTER",
    "matmul": "kernels.matmul:ADAPTER",
}


def adapter_for(name: str) -> Adapter:
    """The adapter of kernel ``name``; ``KeyError`` naming the known ones otherwise."""
    if name not in ADAPTERS:
        raise KeyError(f"No kernel adapter {name!r}; known: {', '.join(sorted(ADAPTERS))}.")
    found: Adapter = pkgutil.resolve_name(ADAPTERS[name])
    return found
