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

This module is the manifest's public face (:class:`Manifest`, :func:`load_manifest`,
:func:`parse_manifest`); its parts sit beside it, one job each: the entries
(:mod:`~warmup.core.manifest_entries`), their shapes (:mod:`~warmup.core.manifest_shapes`),
the bounded read (:mod:`~warmup.core.manifest_read`) and the error lines
(:mod:`~warmup.core.manifest_errors`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import kernels
from warmup.core.manifest_entries import (
    MAX_CACHES,
    CacheEntry,
    ManifestEntry,
    ModelEntry,
    no_nested_paths,
    resolve_model_builder,
    resolve_user_function,
    validation_context,
)
from warmup.core.manifest_errors import MAX_ERRORS, ManifestError, at_most, describe_all
from warmup.core.manifest_read import MAX_MANIFEST_BYTES, plain_data, read_bounded
from warmup.core.manifest_shapes import MAX_SHAPES

# The manifest's public face: its parts, its limits and its error, as its readers import them
__all__ = [
    "MAX_ERRORS",
    "MAX_MANIFEST_BYTES",
    "MAX_SHAPES",
    "CacheEntry",
    "Manifest",
    "ManifestEntry",
    "ManifestError",
    "ModelEntry",
    "load_manifest",
    "parse_manifest",
    "resolve_model_builder",
    "resolve_user_function",
]


class Manifest(BaseModel):
    """What to warm: the kernels' entries, the compiled models and the folders kept for
    the server, checked as a whole (something to warm, names declared once, folders
    apart, one limit on the shapes)."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    entries: list[ManifestEntry] = []
    models: list[ModelEntry] = []
    caches: list[CacheEntry] = Field([], max_length=MAX_CACHES)

    @model_validator(mode="after")
    def _something_to_warm(self) -> Manifest:
        if not self.entries and not self.models and not self.caches:
            raise ValueError("the manifest declares nothing to warm: add entries, models or caches")
        names = [model.name for model in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"models: the name(s) {twice} are declared more than once")
        folders = [cache.name for cache in self.caches]
        twice = sorted({name for name in folders if folders.count(name) > 1})
        if twice:
            raise ValueError(f"caches: the name(s) {twice} are declared more than once")
        no_nested_paths(self.caches)
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
        if not self.entries and not self.models:  # folders alone: restored for any world
            return
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


def load_manifest(
    path: Path, *, find_functions: bool = False, notes: list[str] | None = None
) -> Manifest:
    """Read and validate; :class:`ManifestError` lists every problem at once. With
    ``find_functions``, also each ``module:function`` the manifest names is found and its
    signature read, without importing it
    (:func:`~warmup.core.module_finder.find_function`); those it could not check so are
    appended to ``notes``."""
    return parse_manifest(
        read_bounded(path), source=str(path), find_functions=find_functions, notes=notes
    )


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
    ``find_functions``, each ``module:function`` too
    (:func:`~warmup.core.module_finder.find_function`)."""
    data = plain_data(text, source)
    context = validation_context(find_functions=find_functions, notes=notes)
    try:
        return Manifest.model_validate(data, context=context)
    except ValidationError as e:
        raise ManifestError(source, at_most(describe_all(e.errors()))) from None
