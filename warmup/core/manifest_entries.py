"""A manifest's entries: a kernel's (``entries:``), a compiled model's (``models:``) and
a declared folder's (``caches:``), each a pydantic model checked field by field.

Validation itself runs nothing of the user's: a kernel's rule on its shapes is read from
:mod:`kernels.shapes` (no torch), and, when :func:`validation_context` asks for it, each
``module:function`` is found and its signature read without importing it
(:func:`~warmup.core.module_finder.find_function`). :func:`resolve_user_function` and
:func:`resolve_model_builder` import them, where a run imports them anyway.
"""

from __future__ import annotations

import itertools
import math
import re
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

from kernels import ADAPTERS
from kernels.shapes import RULES, check_shape
from warmup.core.manifest_shapes import (
    MAX_SHAPES,
    Dim,
    ShapeSpec,
    TensorSpec,
    check_dim,
    dim_count,
    dim_values,
)
from warmup.core.module_finder import find_function, import_callable
from warmup.core.plain_yaml import short

MAX_REASONS = 5  # a kernel's reasons listed for one entry's rejected shapes; the rest counted
MAX_CACHES = 16  # declared folders: each is restored and saved whole
MAX_CACHE_KEY = 256
MAX_KEY_ENV = 32  # a declared folder's key_env patterns (its engine's come on top)
MAX_KEY_ENV_PATTERN = 128
MAX_KEY_PATHS = 16  # registry.families.engine_key's bounds, kept here: no registry import
MAX_KEY_PATH = 1024
# registry.families.engine_key.ENGINES's names (a test holds the two equal)
Engine = Literal["vllm", "sglang", "deepgemm", "flashinfer"]
MAX_INPUTS = 32  # tensors a model takes
WARM_KEYWORDS = ("shape", "dtype", "device")  # a user's warm function is called with these
BUILD_KEYWORDS = ("device",)  # a model's builder is called with this (warmup and server)
# registry.core.patterns.MODEL_NAME's twin, kept here so that validating needs no registry
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_USER_KERNEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_DIM_NAME = re.compile(r"^[A-Za-z_]\w{0,31}$")
_ENV_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!]+$")  # a variable name, or fnmatch's syntax
# Validation context keys: find the user's functions (without running them); the shapes
# the kernels' rules may still expand in this pass; notes on functions left to the run.
_FIND_FUNCTIONS, _SHAPES_LEFT, _NOTES = "find_functions", "shapes_left", "notes"


def validation_context(*, find_functions: bool, notes: list[str] | None) -> dict[str, Any]:
    """The context of one validation pass (``model_validate(..., context=...)``): whether
    to find the user's functions, the shapes the kernels' rules may still expand, and the
    list that collects the notes on functions left to the run."""
    return {
        _FIND_FUNCTIONS: find_functions,
        _SHAPES_LEFT: MAX_SHAPES,
        _NOTES: notes if notes is not None else [],
    }


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
    # how the server serves it: None takes the settings' (models_serve, "auto" by default)
    serve: Literal["auto", "package", "compiled"] | None = None
    package_weights: bool = False  # the package carries its own copy of the weights

    @field_validator("name")
    @classmethod
    def _a_name(cls, name: str) -> str:
        if not MODEL_NAME.match(name):
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

    def served_as(self, default: str) -> str:
        """How the server serves it: its own ``serve``, else ``default`` (the settings')."""
        return self.serve or default

    def ranges(self) -> dict[str, tuple[int, int]]:
        """Each dim's smallest and largest declared value: what a package serves."""
        return {name: (min(dim_values(d)), max(dim_values(d))) for name, d in self.dims.items()}

    def expand(self) -> list[dict[str, int]]:
        """Every combination of the dims, in order (the first dim varies slowest)."""
        names = list(self.dims)
        axes = [dim_values(self.dims[name]) for name in names]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


class ManifestEntry(BaseModel):
    """A kernel to warm: a kernel with an adapter or a user's ``module:function``, its
    dtype, world size and policy on a miss, and the shape lines it is warmed at."""

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
        """The entry's shapes, each once, in the order first declared."""
        seen: dict[tuple[int, int, int], dict[str, int]] = {}
        for spec in self.shapes:
            for shape in spec.expand():
                seen.setdefault((shape["M"], shape["N"], shape["K"]), shape)
        return list(seen.values())


class CacheEntry(BaseModel):
    """A folder to keep for the server (``caches:``): an engine's own cache root, stored
    on the volume by ``name``, ``key`` and host, restored at ``path`` before the server
    starts and saved after (``registry.families.declared``). What else its engine keys
    its cache on is recorded with it and compared on restore
    (``registry.families.engine_key``): its ``engine``'s known variables, and the
    entry's own ``key_env`` (names or ``fnmatch`` patterns) and ``key_paths``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    path: Path
    key: str = Field(min_length=1, max_length=MAX_CACHE_KEY)
    engine: Engine | None = None
    key_env: list[str] = Field([], max_length=MAX_KEY_ENV)
    key_paths: list[Path] = Field([], max_length=MAX_KEY_PATHS)

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

    @field_validator("key_env")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not 0 < len(pattern) <= MAX_KEY_ENV_PATTERN or not _ENV_PATTERN.match(pattern):
                raise ValueError(
                    f"key_env {short(pattern)} is not a variable name or pattern: 1-"
                    f"{MAX_KEY_ENV_PATTERN} of A-Z a-z 0-9 _ and the wildcards * ? [ ] !"
                )
            if not re.search(r"[A-Za-z0-9_]", pattern):
                raise ValueError(
                    f"key_env {short(pattern)} names no variable (it would match every "
                    "one); name a prefix, as VLLM_*"
                )
        return patterns

    @field_validator("key_paths")
    @classmethod
    def _absolute(cls, paths: list[Path]) -> list[Path]:
        for path in paths:
            text = str(path)
            if not path.is_absolute() or len(text) > MAX_KEY_PATH or "\0" in text:
                raise ValueError(
                    f"key_paths {short(text)} must be an absolute path of at most "
                    f"{MAX_KEY_PATH} characters"
                )
        return paths


def no_nested_paths(caches: list[CacheEntry]) -> None:
    """ValueError when one declared folder is, or is inside, another: its files would be
    saved twice and restored across folders."""
    for a, b in itertools.permutations(caches, 2):
        if a.path == b.path or b.path in a.path.parents:
            raise ValueError(
                f"caches: {a.name}'s path {short(str(a.path))} is inside {b.name}'s "
                f"({short(str(b.path))}); declare folders that do not overlap"
            )


def resolve_user_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function, checked to take the keywords a
    warmup calls it with (``shape``, ``dtype``, ``device``); ValueError saying why not."""
    return import_callable(spec, WARM_KEYWORDS)


def resolve_model_builder(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function that builds a model, checked to take
    the keyword a warmup and a server call it with (``device``); ValueError saying why not."""
    return import_callable(spec, BUILD_KEYWORDS)


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
    """Whether this validation asked for ``key`` (:func:`validation_context`)."""
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
