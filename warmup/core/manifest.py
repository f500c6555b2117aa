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
:mod:`warmup.core.plain_yaml` (no anchors, aliases, duplicate keys or tags, bounded depth and
node count); a dimension is an int in [1, 2**31 - 1] and a list at most
:data:`MAX_SHAPES` long; the whole manifest stands for at most :data:`MAX_SHAPES` shapes,
counted by arithmetic before anything is expanded (duplicates counted). Each refusal is
a :class:`ManifestError` line; at most :data:`MAX_ERRORS` lines are listed, then how
many more.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

import kernels
from kernels import ADAPTERS
from kernels.shapes import RULES, check_shape
from registry.core.errors import BadInput
from warmup.core import plain_yaml
from warmup.core.manifest_shapes import (
    MAX_SHAPES,
    Dim,
    Pow2,
    ShapeSpec,
    Stepped,
    TensorSpec,
    check_dim,
    dim_count,
    dim_values,
)
from warmup.core.module_finder import (
    find_function,
    find_spec,
    import_callable,
    working_folder_importable,
)
from warmup.core.plain_yaml import clip, short

MAX_MANIFEST_BYTES = 1 << 20
MAX_ERRORS = 50  # error lines listed; the rest are counted
MAX_REASONS = 5  # a kernel's reasons listed for one entry's rejected shapes; the rest counted
_USER_KERNEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
WARM_KEYWORDS = ("shape", "dtype", "device")  # a user's warm function is called with these
BUILD_KEYWORDS = ("device",)  # a model's builder is called with this (warmup and server)
# Validation context keys: find the user's functions (without running them); the shapes
# the kernels' rules may still expand in this pass; notes on functions left to the run.
_FIND_FUNCTIONS, _SHAPES_LEFT, _NOTES = "find_functions", "shapes_left", "notes"
# warmup.compiled.key finds a model's module, without running it, by these names
_find_spec, _working_folder_importable = find_spec, working_folder_importable


class ManifestError(BadInput, ValueError):
    """The manifest is unusable; ``errors`` holds one line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"Manifest {source} has {len(errors)} error(s):\n  " + "\n  ".join(errors))
        self.source, self.errors = source, errors

    def lines(self) -> list[str]:
        """One line per problem, each naming the manifest (a YAML error keeps its caret)."""
        return [f"{self.source}: {error}" for error in self.errors]


MAX_CACHES = 16  # declared folders: each is restored and saved whole
MAX_CACHE_KEY = 256
_MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_DIM_NAME = re.compile(r"^[A-Za-z_]\w{0,31}$")
MAX_INPUTS = 32  # tensors a model takes


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
    def _a_function(cls, build: str, info: ValidationInfo) -> str:
        if not _USER_KERNEL.match(build):
            raise ValueError(f"build {short(build)} is not 'package.module:function'")
        if _asked(info, _FIND_FUNCTIONS):
            _note(info, build, find_function(build, BUILD_KEYWORDS))
        return build

    @field_validator("dims")
    @classmethod
    def _dims(cls, dims: dict[str, Dim]) -> dict[str, Dim]:
        for name, dim in dims.items():
            if not _DIM_NAME.match(name):
                raise ValueError(f"dimension name {short(name)} is not an identifier")
            check_dim(name, dim)
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
        return math.prod(dim_count(dim) for dim in self.dims.values())

    def expand(self) -> list[dict[str, int]]:
        """Every combination of the dims, in order (the first dim varies slowest)."""
        names = list(self.dims)
        axes = [dim_values(self.dims[name]) for name in names]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernel: str
    dtype: Literal["bf16", "fp16", "fp32"]
    world_size: int = Field(ge=1, le=8)
    policy: Literal["tune", "fallback", "fail"] = "tune"
    shapes: list[ShapeSpec] = Field(min_length=1)

    @model_validator(mode="wrap")
    @classmethod
    def _a_known_kernel(
        cls, data: Any, handler: ModelWrapValidatorHandler[ManifestEntry]
    ) -> ManifestEntry:
        """A kernel with an adapter, or a ``module:function``: said beside the entry's
        other errors, not instead of them (an "after" validator runs only once every
        field is valid)."""
        kernel = data.get("kernel") if isinstance(data, dict) else None
        problem = _unknown_kernel(kernel) if isinstance(kernel, str) else None
        try:
            entry = handler(data)
        except ValidationError as e:
            if problem is None:
                raise
            others = cast(list[InitErrorDetails], e.errors())
            raise ValidationError.from_exception_data(
                e.title, [_value_error(problem, kernel), *others]
            ) from None
        if problem is not None:
            raise ValidationError.from_exception_data(cls.__name__, [_value_error(problem, kernel)])
        return entry

    @field_validator("kernel")
    @classmethod
    def _a_function_found(cls, kernel: str, info: ValidationInfo) -> str:
        if _USER_KERNEL.match(kernel) and _asked(info, _FIND_FUNCTIONS):
            _note(info, kernel, find_function(kernel, WARM_KEYWORDS))
        return kernel

    @field_validator("shapes")
    @classmethod
    def _taken_by_the_kernel(cls, shapes: list[ShapeSpec], info: ValidationInfo) -> list[ShapeSpec]:
        """The kernel's rule on each shape (:mod:`kernels.shapes`, no torch): checked even
        when another field of the entry is wrong, so that one pass lists every error."""
        kernel, world = info.data.get("kernel"), info.data.get("world_size")
        if kernel not in RULES or not RULES[kernel].restricts or world is None:
            return shapes  # nothing to check, or a bad kernel or world size: its own error
        if not _may_expand(shapes, info):
            return shapes  # too many shapes: the manifest's limit says so
        reasons = [
            reason
            for spec in shapes
            for shape in spec.expand()
            if (reason := check_shape(kernel, shape, world_size=world))
        ]
        if not reasons:
            return shapes
        listed = list(dict.fromkeys(reasons))
        more = f"; and {len(listed) - MAX_REASONS} more" if len(listed) > MAX_REASONS else ""
        raise ValueError(
            f"{kernel} rejects {len(reasons)} shape(s): {'; '.join(listed[:MAX_REASONS])}{more}"
        )

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


class CacheEntry(BaseModel):
    """A folder to keep for the server (``caches:``): an engine's own cache root, stored
    on the volume by ``name``, ``key`` and host, restored at ``path`` before the server
    starts and saved after (``registry.families.declared``)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    path: Path
    key: str = Field(min_length=1, max_length=MAX_CACHE_KEY)

    @field_validator("name")
    @classmethod
    def _a_name(cls, name: str) -> str:
        return ModelEntry._a_name(name)

    @field_validator("path")
    @classmethod
    def _a_folder(cls, path: Path) -> Path:
        if not path.is_absolute() or path == Path(path.anchor):
            raise ValueError(f"path {short(str(path))} must be an absolute folder other than /")
        return path


def _no_nested_paths(caches: list[CacheEntry]) -> None:
    """ValueError when one declared folder is, or is inside, another: its files would be
    saved twice and restored across folders."""
    for a, b in itertools.permutations(caches, 2):
        if a.path == b.path or b.path in a.path.parents:
            raise ValueError(
                f"caches: {a.name}'s path {short(str(a.path))} is inside {b.name}'s "
                f"({short(str(b.path))}); declare folders that do not overlap"
            )


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    entries: list[ManifestEntry] = []
    models: list[ModelEntry] = []
    caches: list[CacheEntry] = Field([], max_length=MAX_CACHES)

    @model_validator(mode="after")
    def _something_to_warm(self) -> Manifest:
        if not self.entries and not self.models:
            raise ValueError("the manifest declares nothing to warm: add entries or models")
        names = [model.name for model in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"models: the name(s) {twice} are declared more than once")
        folders = [cache.name for cache in self.caches]
        twice = sorted({name for name in folders if folders.count(name) > 1})
        if twice:
            raise ValueError(f"caches: the name(s) {twice} are declared more than once")
        _no_nested_paths(self.caches)
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

    def no_entry_message(self, world: int, *, command_line: bool = False) -> str:
        """Why a pod of ``world`` ranks has nothing to warm, and the fix in its caller's
        words: the command line's ``--world-size``, or else a process group's size
        (``warmup.warm`` and torchrun ranks take theirs from torch.distributed)."""
        sizes = ", ".join(map(str, sorted(self.world_sizes())))
        largest = max(self.world_sizes())
        fix = (
            f"run with --world-size {largest}"
            if command_line
            else f"warm in a process group of world_size={largest} (torch.distributed)"
        )
        return (
            f"the manifest has no entry for world size {world}: its entries are for world "
            f"size {sizes} ({'; '.join(self.skipped_entries(world))}); {fix} or add "
            f"entries with world_size: {world}"
        )

    def require_world(
        self, world: int, source: str = "<manifest>", *, command_line: bool = False
    ) -> None:
        """:class:`ManifestError` when a pod of ``world`` ranks would warm nothing."""
        if self.shape_count(world) + self.model_shape_count(world) == 0:
            raise ManifestError(source, [self.no_entry_message(world, command_line=command_line)])

    def check_kernels(self, source: str = "<manifest>") -> None:
        """What only the imported code can tell, where a run imports it anyway: each
        user function and builder, imported and its signature read, and each adapter's
        own shape check (imports the kernels, so torch and triton). :class:`ManifestError`
        lists every problem. Validation checks the same without importing anything
        (``parse_manifest(..., find_functions=True)``, :mod:`kernels.shapes`)."""

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
    return import_callable(spec, WARM_KEYWORDS)


def resolve_model_builder(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function that builds a model, checked to take
    the keyword a warmup and a server call it with (``device``); ValueError saying why not."""
    return import_callable(spec, BUILD_KEYWORDS)


def load_manifest(
    path: Path, *, find_functions: bool = False, notes: list[str] | None = None
) -> Manifest:
    """Read and validate; :class:`ManifestError` lists every problem at once. With
    ``find_functions``, also each ``module:function`` the manifest names is found and its
    signature read, without importing it (:func:`find_function`); those it could not
    check so are appended to ``notes``."""
    return parse_manifest(_read(path), source=str(path), find_functions=find_functions, notes=notes)


def parse_manifest(
    text: str | bytes,
    *,
    source: str = "<text>",
    find_functions: bool = False,
    notes: list[str] | None = None,
) -> Manifest:
    """Validate a manifest's text (or its bytes: UTF-8); :class:`ManifestError` lists every
    problem, or the one limit of the text it passes (see the module's limits). Each
    kernel's rule on its shapes is checked (:mod:`kernels.shapes`); with
    ``find_functions``, each ``module:function`` too (:func:`find_function`)."""
    try:
        data = plain_yaml.load(plain_yaml.decode(text, MAX_MANIFEST_BYTES, "a manifest"), source)
    except plain_yaml.Refused as e:
        raise ManifestError(source, _at_most(list(e.args))) from None
    context = {
        _FIND_FUNCTIONS: find_functions,
        _SHAPES_LEFT: MAX_SHAPES,
        _NOTES: notes if notes is not None else [],
    }
    try:
        return Manifest.model_validate(data, context=context)
    except ValidationError as e:
        raise ManifestError(source, _at_most(_describe_all(e.errors()))) from None


def _unknown_kernel(kernel: str) -> str | None:
    """Why ``kernel`` names no kernel, or None."""
    if kernel in ADAPTERS or _USER_KERNEL.match(kernel):
        return None
    known = ", ".join(repr(name) for name in sorted(ADAPTERS))
    return f"kernel {short(kernel)} is neither one of {known} nor 'module:function'"


def _value_error(message: str, value: Any) -> InitErrorDetails:
    """One error line, at the place of the validator that raises it."""
    error = PydanticCustomError("value_error", "{message}", {"message": message})
    return InitErrorDetails(type=error, loc=(), input=value)


def _asked(info: ValidationInfo, key: str) -> bool:
    """Whether this validation asked for ``key`` (:func:`parse_manifest`'s context)."""
    return bool(isinstance(info.context, dict) and info.context.get(key))


def _note(info: ValidationInfo, spec: str, note: str | None) -> None:
    """Keep why ``spec`` was left to the run's import (:func:`find_function`)."""
    if note is not None and isinstance(info.context, dict):
        info.context[_NOTES].append(
            f"{spec} not checked without importing it ({note}): the run imports it and "
            "checks it before tuning"
        )


def _may_expand(shapes: list[ShapeSpec], info: ValidationInfo) -> bool:
    """Whether an entry's shapes may be expanded for its kernel's rule: all entries'
    together stay within :data:`MAX_SHAPES` (a manifest over it is refused for that), so
    a hostile manifest costs no more than a valid one. Spends from the pass's context."""
    count = sum(spec.count() for spec in shapes)
    context = info.context if isinstance(info.context, dict) else {}
    left = int(context.get(_SHAPES_LEFT, MAX_SHAPES))
    if count > left:
        return False
    context[_SHAPES_LEFT] = left - count
    return True


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


_UNION_MEMBERS = {"int", "list[int]", Pow2.__name__, Stepped.__name__}  # as pydantic names them
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
