"""The shape manifest: what to warm, declared ahead (YAML or JSON).

    version: 1
    entries:
      - kernel: ag_gemm              # a kernels.ADAPTERS name, or "package.module:function"
        dtype: bf16                  # bf16 | fp16 | fp32
        world_size: 2
        policy: tune                 # tune misses | fallback (never tune) | fail on a miss
        shapes:
          - {M: 4096, N: 6656, K: 16384}
          - {M: {pow2: [2, 256]}, N: 4096, K: 4096}      # decode batches: 2, 4, ..., 256
          - {M: [8192, 16384], N: {start: 1024, stop: 4097, step: 1024}, K: 8192}

A dimension is an int, a list of ints, ``{pow2: [lo, hi]}`` or ``{start, stop, step}``;
a shape line stands for every combination. A bad manifest fails before any GPU work,
listing every error with its field path and value.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernels import ADAPTERS

MAX_SHAPES = 4096
_USER_KERNEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ManifestError(ValueError):
    """The manifest is unusable; ``errors`` holds one line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"Manifest {source} has {len(errors)} error(s):\n  " + "\n  ".join(errors))
        self.errors = errors


class Pow2(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pow2: tuple[int, int]

    @model_validator(mode="after")
    def _bounds(self) -> Pow2:
        lo, hi = self.pow2
        if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
            raise ValueError(f"pow2 bounds {list(self.pow2)} must be powers of two, 1 <= lo <= hi")
        return self

    def values(self) -> list[int]:
        lo, hi = self.pow2
        return [1 << e for e in range(lo.bit_length() - 1, hi.bit_length())]


class Stepped(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start: int = Field(ge=1)
    stop: int = Field(ge=2)
    step: int = Field(1, ge=1)

    def values(self) -> list[int]:
        return list(range(self.start, self.stop, self.step))


Dim = int | list[int] | Pow2 | Stepped


class ShapeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    M: Dim
    N: Dim
    K: Dim

    def expand(self) -> list[dict[str, int]]:
        axes = [_values(getattr(self, name)) for name in ("M", "N", "K")]
        return [
            dict(zip(("M", "N", "K"), combo, strict=True)) for combo in itertools.product(*axes)
        ]


def _values(dim: Dim) -> list[int]:
    if isinstance(dim, int):
        return [dim]
    if isinstance(dim, list):
        return list(dim)
    return dim.values()


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernel: str
    dtype: Literal["bf16", "fp16", "fp32"]
    world_size: int = Field(ge=1, le=8)
    policy: Literal["tune", "fallback", "fail"] = "tune"
    shapes: list[ShapeSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> ManifestEntry:
        if self.kernel not in ADAPTERS and not _USER_KERNEL.match(self.kernel):
            known = ", ".join(repr(name) for name in sorted(ADAPTERS))
            raise ValueError(
                f"kernel {self.kernel!r} is neither one of {known} nor 'module:function'"
            )
        shapes = self.expand()
        if len(shapes) > MAX_SHAPES:
            raise ValueError(f"{len(shapes)} shapes after expansion; the limit is {MAX_SHAPES}")
        for shape in shapes:
            bad = [f"{k}={v}" for k, v in shape.items() if v < 1]
            if bad:
                raise ValueError(f"shape {shape}: {', '.join(bad)} must be >= 1")
        return self

    @property
    def is_user_function(self) -> bool:
        """A ``module:function`` the user warms with, not a kernel with an adapter."""
        return self.kernel not in ADAPTERS

    def expand(self) -> list[dict[str, int]]:
        seen: dict[tuple[int, int, int], dict[str, int]] = {}
        for spec in self.shapes:
            for shape in spec.expand():
                seen.setdefault((shape["M"], shape["N"], shape["K"]), shape)
        return list(seen.values())


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    entries: list[ManifestEntry] = Field(min_length=1)

    def digest(self) -> str:
        """What readiness is checked against: the same manifest, not just any warm run."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def world_sizes(self) -> set[int]:
        return {e.world_size for e in self.entries}

    def check_kernels(self, source: str = "<manifest>") -> None:
        """Each adapter's own shape check (imports the kernels, so torch and triton):
        :class:`ManifestError` lists every shape a kernel rejects."""
        import kernels

        errors = []
        for index, entry in enumerate(self.entries):
            if entry.is_user_function:
                continue
            adapter = kernels.adapter_for(entry.kernel)
            for shape in entry.expand():
                reason = adapter.check_shape(shape, world_size=entry.world_size)
                if reason:
                    errors.append(f"entries.{index}: {entry.kernel} shape {shape}: {reason}")
        if errors:
            raise ManifestError(source, errors)


def load_manifest(path: Path, *, check_kernels: bool = False) -> Manifest:
    """Read and validate; :class:`ManifestError` lists every problem at once. With
    ``check_kernels``, also each kernel's own shape check (imports torch)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ManifestError(str(path), [f"cannot read: {e}"]) from None
    manifest = parse_manifest(text, source=str(path))
    if check_kernels:
        manifest.check_kernels(str(path))
    return manifest


def parse_manifest(text: str, *, source: str = "<text>") -> Manifest:
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as e:
        raise ManifestError(source, [f"not YAML or JSON: {e}".replace("\n", " ")]) from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise ManifestError(source, _describe_all(e.errors())) from None


_UNION_MEMBERS = {"int", "list[int]", "Pow2", "Stepped"}
_DIM_HELP = "must be an int, a list of ints, {pow2: [lo, hi]} or {start, stop, step}"


def _describe_all(errors: list[Any]) -> list[str]:
    """One line per problem: a union dimension's per-member complaints become one."""
    lines: list[str] = []
    dims: dict[str, tuple[str, Any]] = {}
    for error in errors:
        loc = [str(p) for p in error["loc"]]
        member = next((p for p in loc if _is_member(p)), None)
        message = str(error["msg"]).removeprefix("Value error, ")
        if member is None:
            lines.append(f"{'.'.join(loc) or '(top)'}: {message} (got {error.get('input')!r})")
            continue
        path = ".".join(loc[: loc.index(member)])
        custom = error["type"] == "value_error"  # our own check: the most specific
        if path not in dims or custom:
            dims[path] = (message if custom else _DIM_HELP, error.get("input"))
    for path, (message, value) in dims.items():
        lines.append(f"{path}: {message} (got {value!r})")
    return lines


def _is_member(part: str) -> bool:
    # pydantic names the union member it tried: "int", "Pow2", "function-after[..., Pow2]"
    return part in _UNION_MEMBERS or part.startswith("function-")
