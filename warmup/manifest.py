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

import contextlib
import hashlib
import importlib
import inspect
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
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
        self.source, self.errors = source, errors

    def lines(self) -> list[str]:
        """One line per problem, each naming the manifest (a YAML error keeps its caret)."""
        return [f"{self.source}: {error}" for error in self.errors]


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

    def entries_for(self, world: int) -> list[ManifestEntry]:
        """The entries a pod of ``world`` ranks warms; the others are skipped."""
        return [e for e in self.entries if e.world_size == world]

    def shape_count(self, world: int) -> int:
        """Shapes each rank of a ``world``-rank pod warms."""
        return sum(len(e.expand()) for e in self.entries_for(world))

    def skipped_entries(self, world: int) -> list[str]:
        return [
            f"entries.{i} ({e.kernel}, world size {e.world_size})"
            for i, e in enumerate(self.entries)
            if e.world_size != world
        ]

    def no_entry_message(self, world: int) -> str:
        sizes = ", ".join(map(str, sorted(self.world_sizes())))
        return (
            f"the manifest has no entry for world size {world}: its entries are for world "
            f"size {sizes} ({'; '.join(self.skipped_entries(world))}); run with "
            f"--world-size {max(self.world_sizes())} or add entries with world_size: {world}"
        )

    def require_world(self, world: int, source: str = "<manifest>") -> None:
        """:class:`ManifestError` when a pod of ``world`` ranks would warm nothing."""
        if self.shape_count(world) == 0:
            raise ManifestError(source, [self.no_entry_message(world)])

    def check_kernels(self, source: str = "<manifest>") -> None:
        """Each adapter's own shape check (imports the kernels, so torch and triton):
        :class:`ManifestError` lists every shape a kernel rejects."""
        import kernels

        errors = []
        for index, entry in enumerate(self.entries):
            if entry.is_user_function:
                try:
                    resolve_user_function(entry.kernel)
                except ValueError as e:
                    errors.append(f"entries.{index}.kernel: {e}")
                continue
            adapter = kernels.adapter_for(entry.kernel)
            for shape in entry.expand():
                reason = adapter.check_shape(shape, world_size=entry.world_size)
                if reason:
                    errors.append(f"entries.{index}: {entry.kernel} shape {shape}: {reason}")
        if errors:
            raise ManifestError(source, errors)


def resolve_user_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function, checked to take the keywords a
    warmup calls it with (``shape``, ``dtype``, ``device``); ValueError saying why not."""
    module_name, _, name = spec.partition(":")
    try:
        with _working_folder_importable():
            module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raises at import
        raise ValueError(
            f"{spec!r}: cannot import {module_name}: {type(e).__name__}: {e}"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{spec!r}: module {module_name} has no function {name!r}")
    try:
        inspect.signature(function).bind(shape={}, dtype=None, device=None)
    except TypeError as e:
        raise ValueError(
            f"{spec!r}: a warmup calls it as {name}(shape=..., dtype=..., device=...), "
            f"which its signature {name}{inspect.signature(function)} refuses: {e}"
        ) from None
    except ValueError:  # no signature to read (a builtin): its call will tell
        pass
    return function  # type: ignore[no-any-return]


@contextlib.contextmanager
def _working_folder_importable() -> Iterator[None]:
    """Import as the ranks will: they run ``python -m``, which puts the working folder
    first on ``sys.path`` (an installed console script does not)."""
    here = os.getcwd()
    added = "" not in sys.path and here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


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
        raise ManifestError(source, [_yaml_error(e, source)]) from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise ManifestError(source, _describe_all(e.errors())) from None


def _yaml_error(error: yaml.YAMLError, source: str) -> str:
    """``file:line:column: problem``, then the line with a caret under the column."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if mark is None:
        return f"not YAML or JSON: {problem}"
    context = getattr(error, "context", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}"
    lines = mark.buffer.splitlines() if mark.buffer else []
    text = lines[mark.line].rstrip("\0") if mark.line < len(lines) else ""
    snippet = f"\n      {text}\n      {' ' * mark.column}^" if text.strip() else ""
    return (
        f"not YAML or JSON at {where}: {problem}" + (f" ({context})" if context else "") + snippet
    )


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
