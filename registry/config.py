"""Kernel configs and their measurements, as values: frozen, hashable, JSON both ways."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from registry.errors import RegistryError, shown

Scalar = int | float | str | bool | None
_LAUNCH_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass(frozen=True)
class KernelConfig:
    """One point of a kernel's config space: meta-parameters plus launch options.

    Mirrors ``triton.Config`` without importing triton; ``kwargs`` holds the
    ``tl.constexpr`` meta-parameters (BLOCK_M, ...), sorted so equal configs hash equal.
    """

    kwargs: tuple[tuple[str, Scalar], ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
    maxnreg: int | None = None

    @classmethod
    def make(cls, kwargs: Mapping[str, Scalar] | None = None, **launch: Any) -> KernelConfig:
        """Build from a mapping, as ``triton.Config(kwargs, num_warps=...)`` is called."""
        unknown = set(launch) - set(_LAUNCH_FIELDS)
        if unknown:
            raise RegistryError(f"KernelConfig got unknown launch option(s) {sorted(unknown)}.")
        return cls(kwargs=tuple(sorted((kwargs or {}).items())), **launch)

    @property
    def meta(self) -> dict[str, Scalar]:
        """The meta-parameters as a dict, ready to pass to a kernel launch."""
        return dict(self.kwargs)

    def all_kwargs(self) -> dict[str, Scalar]:
        """Meta-parameters plus every launch option that is set: what a launch passes."""
        launch = {name: getattr(self, name) for name in _LAUNCH_FIELDS}
        return {**self.meta, **{k: v for k, v in launch.items() if v is not None}}

    def to_json(self) -> dict[str, Any]:
        return {
            "kwargs": self.meta,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "num_ctas": self.num_ctas,
            "maxnreg": self.maxnreg,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelConfig:
        """Read the structure ``to_json`` writes; also Triton's ``Config.__dict__``."""
        if not isinstance(data, Mapping) or not isinstance(data.get("kwargs") or {}, Mapping):
            raise RegistryError(f"Config {shown(data)} is not an object with a 'kwargs' object.")
        kwargs = dict(data.get("kwargs") or {})
        for name, value in kwargs.items():
            if not isinstance(name, str) or not isinstance(
                value, (int, float, str, bool, type(None))
            ):
                raise RegistryError(
                    f"Config kwarg {shown(name)} has value {shown(value)}; not a scalar."
                )
        launch = {k: data[k] for k in _LAUNCH_FIELDS if data.get(k) is not None}
        for name, value in launch.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise RegistryError(f"Config '{name}' has value {shown(value)}; not an int.")
        return cls.make(kwargs, **launch)

    def label(self) -> str:
        """A short human label, for tables and logs only (never parsed back)."""
        meta = " ".join(f"{k}={v}" for k, v in self.kwargs)
        return f"{meta} w{self.num_warps} s{self.num_stages}".strip()


def is_time(value: object) -> bool:
    """A JSON number that can be a duration: >= 0 and small enough for a float (a
    400-digit int is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e300


@dataclass(frozen=True)
class Measurement:
    """The timing of one config (milliseconds), or the reason it has none."""

    config: KernelConfig
    median_ms: float = math.inf
    p20_ms: float = math.inf
    p80_ms: float = math.inf
    error: str | None = field(default=None)

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.median_ms)

    def to_json(self) -> dict[str, Any]:
        timing = (self.median_ms, self.p20_ms, self.p80_ms)
        finite = [t if math.isfinite(t) else None for t in timing]
        return {
            "config": self.config.to_json(),
            "median_ms": finite[0],
            "p20_ms": finite[1],
            "p80_ms": finite[2],
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Any) -> Measurement:
        if not isinstance(data, Mapping):
            raise RegistryError(f"Measurement {shown(data)} is not an object.")

        def ms(name: str) -> float:
            value = data.get(name)
            if value is None:
                return math.inf
            if not is_time(value):
                raise RegistryError(
                    f"Measurement '{name}' has value {shown(value)}; not a time >= 0."
                )
            return float(value)

        error = data.get("error")
        if error is not None and not isinstance(error, str):
            raise RegistryError(f"Measurement 'error' has value {shown(error)}; not a string.")
        config = KernelConfig.from_json(data.get("config", {}))
        return cls(config, ms("median_ms"), ms("p20_ms"), ms("p80_ms"), error)
