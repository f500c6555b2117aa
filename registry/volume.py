"""The layout of the mounted volume that carries state between pods and restarts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Volume:
    """``<root>/registry`` (the store), ``<root>/triton-cache`` (compile artifacts),
    ``<root>/inductor`` (compiled models' artifacts), ``<root>/locks`` (file leases),
    ``<root>/bundles`` (archives to install), ``<root>/learned`` (compiled models' shapes
    met under traffic)."""

    root: Path

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def triton_cache(self) -> Path:
        return self.root / "triton-cache"

    @property
    def inductor(self) -> Path:
        return self.root / "inductor"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    @property
    def learned(self) -> Path:
        return self.root / "learned"
