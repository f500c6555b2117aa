"""Kernel configs and their measurements, as values: frozen, hashable, JSON both ways."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from registry.core.errors import RegistryError, shown

Scalar = int | float | str | bool | None
_LAUNCH_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
_ALGORITHM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class KernelConfig:
    """One point of a kernel's config space: the algorithm, its meta-parameters and its
    launch options.

    Mirrors ``triton.Config`` without importing triton; ``kwargs`` holds the
    ``tl.constexpr`` meta-parameters (BLOCK_M, ...), sorted so equal configs hash equal.
    ``algorithm`` names which implementation of the op the config runs (the kernel
    module defines the names); ``None`` is the kernel's original one, the only one a
    config stored before algorithms existed can mean.
    """

    kwargs: tuple[tuple[str, Scalar], ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
    maxnreg: int | None = None
    algorithm: str | None = None

    @classmethod
    def make(
        cls,
        kwargs: Mapping[str, Scalar] | None = None,
        *,
        algorithm: str | None = None,
        **launch: Any,
    ) -> KernelConfig:
        """Build from a mapping, as ``triton.Config(kwargs, num_warps=...)`` is called."""
        unknown = set(launch) - set(_LAUNCH_FIELDS)
        if unknown:
            raise RegistryError(f"KernelConfig got unknown launch option(s) {sorted(unknown)}.")
        if algorithm is not None and not (
            isinstance(algorithm, str) and _ALGORITHM_NAME.match(algorithm)
        ):
            raise RegistryError(
                f"Config 'algorithm' has value {shown(algorithm)}; not a name "
                "(lower-case letters, digits and _, at most 64)."
            )
        return cls(kwargs=tuple(sorted((kwargs or {}).items())), algorithm=algorithm, **launch)

    @property
    def meta(self) -> dict[str, Scalar]:
        """The meta-parameters as a dict, ready to pass to a kernel launch."""
        return dict(self.kwargs)

    def all_kwargs(self) -> dict[str, Scalar]:
        """Meta-parameters plus every launch option that is set: what a launch passes."""
        launch = {name: getattr(self, name) for name in _LAUNCH_FIELDS}
        return {**self.meta, **{k: v for k, v in launch.items() if v is not None}}

    def to_json(self) -> dict[str, Any]:
        """Without an ``algorithm`` field when it is None: the form schema 1 wrote."""
        algorithm = {} if self.algorithm is None else {"algorithm": self.algorithm}
        return {
            **algorithm,
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
        return cls.make(kwargs, algorithm=data.get("algorithm"), **launch)

    def label(self) -> str:
        """A short human label, for tables and logs only (never parsed back). A config
        with an algorithm and no meta-parameters (a library call) is its algorithm."""
        if self.algorithm is not None and not self.kwargs:
            return self.algorithm
        meta = " ".join(f"{k}={v}" for k, v in self.kwargs)
        prefix = "" if self.algorithm is None else f"{self.algorithm} "
        return f"{prefix}{meta} w{self.num_warps} s{self.num_stages}".strip()


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
