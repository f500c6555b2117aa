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

Compiled models (``torch.compile``; see :mod:`warmup.compiled`) are declared beside the
kernels; ``entries`` may then be left out::

    models:
      - name: blocks                 # names the model in status, metrics and the registry
        build: my_server.model:build # build(device=...) -> the callable the server serves
        world_size: 1
        mode: no_grad                # the server calls it under: no_grad | inference_mode | grad
        dims: {batch: [1, 4, 16], seq: 128}       # each dimension as for shapes
        inputs:                      # one tensor per positional argument, dims by name
          - {shape: [batch, seq, 2048], dtype: fp16}
          - {shape: [batch, seq], dtype: int64, high: 32000}    # token ids in [0, high)

Every combination of ``dims`` is one shape the model is compiled and run at.

Limits, so that any file is read or refused in bounded time and memory: the file is at
most :data:`MAX_MANIFEST_BYTES` of UTF-8 (a BOM is accepted) and plain YAML, read by
:mod:`warmup.plain_yaml` (no anchors, aliases, duplicate keys or tags, bounded depth and
node count); a dimension is an int in [1, 2**31 - 1] and a list at most
:data:`MAX_SHAPES` long; the whole manifest stands for at most :data:`MAX_SHAPES` shapes,
counted by arithmetic before anything is expanded (duplicates counted). Each refusal is
a :class:`ManifestError` line; at most :data:`MAX_ERRORS` lines are listed, then how
many more.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import itertools
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kernels import ADAPTERS
from warmup import plain_yaml
from warmup.plain_yaml import clip, short

MAX_SHAPES = 4096  # shapes of the whole manifest, duplicates counted
MAX_DIM = 2**31 - 1  # a dimension is a positive int32
MAX_MANIFEST_BYTES = 1 << 20
MAX_ERRORS = 50  # error lines listed; the rest are counted
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
        lo, hi = self.pow2
        return [1 << e for e in range(lo.bit_length() - 1, hi.bit_length())]


class Stepped(BaseModel):
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
        return list(range(self.start, self.stop, self.step))


_MAX_POW2 = 1 << (MAX_DIM.bit_length() - 1)
Dim = int | list[int] | Pow2 | Stepped


class ShapeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    M: Dim
    N: Dim
    K: Dim

    @field_validator("M", "N", "K")
    @classmethod
    def _in_bounds(cls, dim: Dim, info: ValidationInfo) -> Dim:
        return _check_dim(str(info.field_name), dim)

    def count(self) -> int:
        """Shapes this line stands for (duplicates included), without listing them."""
        return math.prod(_count(getattr(self, name)) for name in ("M", "N", "K"))

    def expand(self) -> list[dict[str, int]]:
        axes = [_values(getattr(self, name)) for name in ("M", "N", "K")]
        return [
            dict(zip(("M", "N", "K"), combo, strict=True)) for combo in itertools.product(*axes)
        ]


def _check_dim(name: str, dim: Dim) -> Dim:
    """A dimension within the manifest's bounds; ValueError naming it otherwise."""
    if isinstance(dim, list) and len(dim) > MAX_SHAPES:
        raise ValueError(f"{len(dim)} values; a list holds at most {MAX_SHAPES}")
    values = [dim] if isinstance(dim, int) else dim if isinstance(dim, list) else []
    for value in values:  # ranges and pow2 check their own bounds
        if not 1 <= value <= MAX_DIM:
            limit = ">= 1" if value < 1 else f"<= {MAX_DIM}"
            raise ValueError(f"{name}={short(value)} must be {limit}")
    return dim


def _count(dim: Dim) -> int:
    if isinstance(dim, int):
        return 1
    if isinstance(dim, list):
        return len(dim)
    return dim.count()


def _values(dim: Dim) -> list[int]:
    if isinstance(dim, int):
        return [dim]
    if isinstance(dim, list):
        return list(dim)
    return dim.values()


_MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_DIM_NAME = re.compile(r"^[A-Za-z_]\w{0,31}$")
MAX_INPUTS = 32  # tensors a model takes
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
        return {size for size in self.shape if isinstance(size, str)}

    def sized(self, dims: dict[str, int]) -> list[int]:
        """The shape with each named dimension replaced by its value in ``dims``."""
        return [dims[size] if isinstance(size, str) else size for size in self.shape]


class ModelEntry(BaseModel):
    """A compiled model to warm: the function that builds it as the server does, the
    shapes of its inputs."""

    model_config = ConfigDict(extra="forbid")
    name: str
    build: str
    world_size: int = Field(1, ge=1, le=8)
    mode: Literal["no_grad", "inference_mode", "grad"] = "no_grad"  # as the server calls it
    dims: dict[str, Dim] = {}
    inputs: list[TensorSpec] = Field(min_length=1, max_length=MAX_INPUTS)

    @field_validator("name")
    @classmethod
    def _a_name(cls, name: str) -> str:
        if not _MODEL_NAME.match(name):
            raise ValueError(
                f"name {short(name)} must be 1-63 of a-z 0-9 _ . - (starting with a letter "
                "or digit)"
            )
        return name

    @field_validator("build")
    @classmethod
    def _a_function(cls, build: str) -> str:
        if not _USER_KERNEL.match(build):
            raise ValueError(f"build {short(build)} is not 'package.module:function'")
        return build

    @field_validator("dims")
    @classmethod
    def _dims(cls, dims: dict[str, Dim]) -> dict[str, Dim]:
        for name, dim in dims.items():
            if not _DIM_NAME.match(name):
                raise ValueError(f"dimension name {short(name)} is not an identifier")
            _check_dim(name, dim)
        return dims

    @model_validator(mode="after")
    def _every_dim_used_and_declared(self) -> ModelEntry:
        used = set().union(*(spec.dim_names() for spec in self.inputs))
        if used - self.dims.keys():
            raise ValueError(
                f"inputs use dimension(s) {sorted(used - self.dims.keys())} that dims does "
                f"not declare (dims: {sorted(self.dims)})"
            )
        if self.dims.keys() - used:
            raise ValueError(f"dims {sorted(self.dims.keys() - used)} are used by no input")
        return self

    def count(self) -> int:
        """Shapes this model stands for, without listing them."""
        return math.prod(_count(dim) for dim in self.dims.values())

    def expand(self) -> list[dict[str, int]]:
        """Every combination of the dims, in order (the first dim varies slowest)."""
        names = list(self.dims)
        axes = [_values(self.dims[name]) for name in names]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


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
                f"kernel {short(self.kernel)} is neither one of {known} nor 'module:function'"
            )
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
    entries: list[ManifestEntry] = []
    models: list[ModelEntry] = []

    @model_validator(mode="after")
    def _something_to_warm(self) -> Manifest:
        if not self.entries and not self.models:
            raise ValueError("the manifest declares nothing to warm: add entries or models")
        names = [model.name for model in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"models: the name(s) {twice} are declared more than once")
        return self

    @model_validator(mode="after")
    def _shape_limit(self) -> Manifest:
        """One limit for the whole manifest, counted before anything is expanded."""
        counts = [
            (f"entries.{i}.shapes.{j}", spec.count())
            for i, entry in enumerate(self.entries)
            for j, spec in enumerate(entry.shapes)
        ] + [(f"models.{i}.dims", model.count()) for i, model in enumerate(self.models)]
        total = sum(count for _, count in counts)
        if total <= MAX_SHAPES:
            return self
        running = itertools.accumulate(count for _, count in counts)
        where = next(w for (w, _), upto in zip(counts, running, strict=True) if upto > MAX_SHAPES)
        raise ValueError(
            f"{where}: the manifest stands for {total} shapes (duplicates counted); the "
            f"limit is {MAX_SHAPES} for the whole manifest, passed at this shape line"
        )

    def digest(self) -> str:
        """What readiness is checked against: the same manifest, not just any warm run."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def world_sizes(self) -> set[int]:
        return {e.world_size for e in self.entries} | {m.world_size for m in self.models}

    def entries_for(self, world: int) -> list[ManifestEntry]:
        """The entries a pod of ``world`` ranks warms; the others are skipped."""
        return [e for e in self.entries if e.world_size == world]

    def models_for(self, world: int) -> list[ModelEntry]:
        """The models a pod of ``world`` ranks warms; the others are skipped."""
        return [m for m in self.models if m.world_size == world]

    def model(self, name: str) -> ModelEntry:
        """The model declared as ``name``; KeyError naming the declared ones."""
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(
            f"the manifest declares no model {name!r}; it declares "
            f"{sorted(m.name for m in self.models) or 'none'}"
        )

    def shape_count(self, world: int) -> int:
        """Kernel shapes each rank of a ``world``-rank pod warms."""
        return sum(len(e.expand()) for e in self.entries_for(world))

    def model_shape_count(self, world: int) -> int:
        """Model shapes each rank of a ``world``-rank pod compiles and runs."""
        return sum(m.count() for m in self.models_for(world))

    def skipped_entries(self, world: int) -> list[str]:
        return [
            f"entries.{i} ({e.kernel}, world size {e.world_size})"
            for i, e in enumerate(self.entries)
            if e.world_size != world
        ] + [
            f"models.{i} ({m.name}, world size {m.world_size})"
            for i, m in enumerate(self.models)
            if m.world_size != world
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
        if self.shape_count(world) + self.model_shape_count(world) == 0:
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
        for index, model in enumerate(self.models):
            try:
                resolve_model_builder(model.build)
            except ValueError as e:
                errors.append(f"models.{index}.build: {e}")
        if errors:
            raise ManifestError(source, errors)


def resolve_user_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function, checked to take the keywords a
    warmup calls it with (``shape``, ``dtype``, ``device``); ValueError saying why not."""
    return _callable_as(spec, shape={}, dtype=None, device=None)


def resolve_model_builder(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function that builds a model, checked to take
    the keyword a warmup and a server call it with (``device``); ValueError saying why not."""
    return _callable_as(spec, device=None)


def _callable_as(spec: str, **keywords: Any) -> Callable[..., Any]:
    """The function ``spec`` names, checked to accept ``keywords`` (as a warmup calls it)."""
    function = _import_function(spec)
    name = spec.partition(":")[2]
    try:
        inspect.signature(function).bind(**keywords)
    except TypeError as e:
        call = ", ".join(f"{keyword}=..." for keyword in keywords)
        raise ValueError(
            f"{spec!r}: a warmup calls it as {name}({call}), which its signature "
            f"{name}{inspect.signature(function)} refuses: {e}"
        ) from None
    except ValueError:  # no signature to read (a builtin): its call will tell
        pass
    return function


def _import_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the callable; ValueError saying why not."""
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
    manifest = parse_manifest(_read(path), source=str(path))
    if check_kernels:
        manifest.check_kernels(str(path))
    return manifest


def parse_manifest(text: str | bytes, *, source: str = "<text>") -> Manifest:
    """Validate a manifest's text (or its bytes: UTF-8); :class:`ManifestError` lists every
    problem, or the one limit of the text it passes (see the module's limits)."""
    try:
        data = plain_yaml.load(plain_yaml.decode(text, MAX_MANIFEST_BYTES, "a manifest"), source)
    except plain_yaml.Refused as e:
        raise ManifestError(source, _at_most(list(e.args))) from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise ManifestError(source, _at_most(_describe_all(e.errors()))) from None


def _read(path: Path) -> bytes:
    """At most one byte over the limit: a huge file (or /dev/zero) is never read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a fifo must not block the open
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(file.fileno())
            if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                raise ManifestError(str(path), ["not a regular file (a fifo or a socket)"])
            data = file.read(MAX_MANIFEST_BYTES + 1)
            size = st.st_size
    except OSError as e:
        raise ManifestError(str(path), [f"cannot read: {e}"]) from None
    if len(data) > MAX_MANIFEST_BYTES:
        found = size if size >= len(data) else None
        raise ManifestError(
            str(path), [plain_yaml.too_big(found, MAX_MANIFEST_BYTES, "a manifest")]
        )
    return data


def _at_most(errors: list[str]) -> list[str]:
    """The first :data:`MAX_ERRORS` lines, then how many more."""
    if len(errors) <= MAX_ERRORS:
        return errors
    return [*errors[:MAX_ERRORS], f"... and {len(errors) - MAX_ERRORS} more errors"]


_UNION_MEMBERS = {"int", "list[int]", "Pow2", "Stepped"}
_DIM_HELP = "must be an int, a list of ints, {pow2: [lo, hi]} or {start, stop, step}"


def _describe_all(errors: list[Any]) -> list[str]:
    """One line per problem: a union dimension's per-member complaints become one."""
    lines: list[str] = []
    dims: dict[str, tuple[str, Any]] = {}
    for error in errors:
        loc = [clip(str(p), 60) for p in error["loc"]]
        member = next((p for p in loc if _is_member(p)), None)
        message = str(error["msg"]).removeprefix("Value error, ")
        if member is None:
            whole = not loc and error["type"] == "value_error"  # the shape limit: names its line
            got = f" (got {short(error.get('input'))})"
            lines.append(message if whole else f"{'.'.join(loc) or '(top)'}: {message}{got}")
            continue
        path = ".".join(loc[: loc.index(member)])
        custom = error["type"] == "value_error"  # our own check: the most specific
        if path not in dims or custom:
            dims[path] = (message if custom else _DIM_HELP, error.get("input"))
    for path, (message, value) in dims.items():
        lines.append(f"{path}: {message} (got {short(value)})")
    return lines


def _is_member(part: str) -> bool:
    # pydantic names the union member it tried: "int", "Pow2", "function-after[..., Pow2]"
    return part in _UNION_MEMBERS or part.startswith("function-")
