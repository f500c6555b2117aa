"""The shapes a manifest declares: its dimensions, a kernel's shape lines, a model's inputs.

A dimension is an int, a list of ints, ``{pow2: [lo, hi]}`` or ``{start, stop, step}``,
each value in [1, :data:`MAX_DIM`] and a list at most :data:`MAX_SHAPES` long; each
counts its values by arithmetic before any is listed (see :mod:`warmup.core.manifest`).
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from warmup.core.plain_yaml import short

MAX_SHAPES = 4096  # shapes of the whole manifest, duplicates counted
MAX_DIM = 2**31 - 1  # a dimension is a positive int32


class Pow2(BaseModel):
    """Powers of two from ``lo`` to ``hi``, both included: ``{pow2: [2, 256]}``."""

    model_config = ConfigDict(extra="forbid")
    pow2: tuple[int, int]

    @model_validator(mode="after")
    def _bounds(self) -> Pow2:
        lo, hi = self.pow2
        if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1) or hi > _MAX_POW2:
            raise ValueError(
                f"pow2 bounds {list(self.pow2)} must be powers of two, 1 <= lo <= hi <= {_MAX_POW2}"
            )
        return self

    def count(self) -> int:
        """How many values, without listing them."""
        lo, hi = self.pow2
        return len(range(lo.bit_length() - 1, hi.bit_length()))

    def values(self) -> list[int]:
        """The values, smallest first."""
        lo, hi = self.pow2
        return [1 << e for e in range(lo.bit_length() - 1, hi.bit_length())]


class Stepped(BaseModel):
    """A range as Python's: ``{start, stop, step}``, ``stop`` excluded."""

    model_config = ConfigDict(extra="forbid")
    start: int = Field(ge=1)
    stop: int = Field(ge=2)
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> Stepped:
        if self.stop <= self.start:
            raise ValueError(
                f"range start {self.start}, stop {self.stop}: no value (stop is exclusive "
                "and must be greater than start)"
            )
        if self.stop > MAX_DIM + 1 or self.step > MAX_DIM:
            raise ValueError(
                f"range start {self.start}, stop {self.stop}, step {self.step}: values must "
                f"be <= {MAX_DIM} (stop <= {MAX_DIM + 1}, step <= {MAX_DIM})"
            )
        return self

    def count(self) -> int:
        """How many values, without listing them (``len`` of a range is arithmetic)."""
        return len(range(self.start, self.stop, self.step))

    def values(self) -> list[int]:
        """The values, smallest first."""
        return list(range(self.start, self.stop, self.step))


_MAX_POW2 = 1 << (MAX_DIM.bit_length() - 1)
Dim = int | list[int] | Pow2 | Stepped


class ShapeSpec(BaseModel):
    """One shape line of a kernel entry: it stands for every combination of M, N, K."""

    model_config = ConfigDict(extra="forbid")
    M: Dim
    N: Dim
    K: Dim

    @field_validator("M", "N", "K")
    @classmethod
    def _in_bounds(cls, dim: Dim, info: ValidationInfo) -> Dim:
        return check_dim(str(info.field_name), dim)

    def count(self) -> int:
        """Shapes this line stands for (duplicates included), without listing them."""
        return math.prod(dim_count(getattr(self, name)) for name in ("M", "N", "K"))

    def expand(self) -> list[dict[str, int]]:
        """Every combination, in order (M varies slowest)."""
        axes = [dim_values(getattr(self, name)) for name in ("M", "N", "K")]
        return [
            dict(zip(("M", "N", "K"), combo, strict=True)) for combo in itertools.product(*axes)
        ]


def check_dim(name: str, dim: Dim) -> Dim:
    """A dimension within the manifest's bounds; ValueError naming it otherwise."""
    if isinstance(dim, list) and len(dim) > MAX_SHAPES:
        raise ValueError(f"{len(dim)} values; a list holds at most {MAX_SHAPES}")
    values = [dim] if isinstance(dim, int) else dim if isinstance(dim, list) else []
    for value in values:  # ranges and pow2 check their own bounds
        if not 1 <= value <= MAX_DIM:
            limit = ">= 1" if value < 1 else f"<= {MAX_DIM}"
            raise ValueError(f"{name}={short(value)} must be {limit}")
    return dim


def dim_count(dim: Dim) -> int:
    """How many values ``dim`` stands for, without listing them."""
    if isinstance(dim, int):
        return 1
    if isinstance(dim, list):
        return len(dim)
    return dim.count()


def dim_values(dim: Dim) -> list[int]:
    """The values ``dim`` stands for, in order."""
    if isinstance(dim, int):
        return [dim]
    if isinstance(dim, list):
        return list(dim)
    return dim.values()


MAX_RANK = 8  # dimensions of one input tensor
InputDtype = Literal["bf16", "fp16", "fp32", "int64", "int32", "bool"]


class TensorSpec(BaseModel):
    """One input tensor of a model: its shape (ints, or the model's dims by name) and
    dtype; integer inputs are drawn from ``[0, high)``."""

    model_config = ConfigDict(extra="forbid")
    shape: list[int | str] = Field(max_length=MAX_RANK)
    dtype: InputDtype
    high: int = Field(2, ge=1, le=MAX_DIM)

    @field_validator("shape")
    @classmethod
    def _sizes(cls, shape: list[int | str]) -> list[int | str]:
        for size in shape:
            if isinstance(size, int) and not 1 <= size <= MAX_DIM:
                raise ValueError(f"size {size} must be in [1, {MAX_DIM}]")
        return shape

    def dim_names(self) -> set[str]:
        """The model's dims this tensor's shape names."""
        return {size for size in self.shape if isinstance(size, str)}

    def sized(self, dims: dict[str, int]) -> list[int]:
        """The shape with each named dimension replaced by its value in ``dims``."""
        return [dims[size] if isinstance(size, str) else size for size in self.shape]
