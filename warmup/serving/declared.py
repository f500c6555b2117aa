"""The layers a manifest declares for one kernel at one world size: what a serving
process's ops of that kernel will serve, so that the kernel can size what they share
once (:meth:`kernels.adapter.Adapter.reserve`)."""

from __future__ import annotations

from kernels.adapter import Layer
from warmup.core.manifest import Manifest


def declared_layers(manifest: Manifest, kernel: str, world: int) -> list[Layer]:
    """One layer per (N, K, dtype) of ``kernel``'s entries for ``world`` ranks, its
    ``max_m`` the largest M declared for it."""
    largest: dict[tuple[int, int, str], int] = {}
    for entry in manifest.entries_for(world):
        if entry.kernel != kernel:
            continue
        for shape in entry.expand():
            key = (shape["N"], shape["K"], entry.dtype)
            largest[key] = max(largest.get(key, 0), shape["M"])
    return [Layer(n, k, dtype, m) for (n, k, dtype), m in largest.items()]
