"""A declared model's key: what its compiled artifacts depend on besides the host.

The build function's own code and its module's, the declared dims and inputs, the
autograd mode, the world size: a change to any of them is a new key, so stale artifacts are never
restored. Read from the source files without importing them (no torch, no model code),
and free of paths: the same code at another mount path has the same key. Code the
build function imports from other modules is not hashed: a change there keeps the key,
and Inductor's own keys (which hash the traced graph) decide whether its artifacts hit.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.core.errors import named
from warmup.core.manifest import ModelEntry
from warmup.core.module_finder import find_spec, working_folder_importable


@dataclass(frozen=True)
class ModelKey:
    """The key's parts (stored in the index, shown by ``explain``) and their digest."""

    parts: dict[str, Any]

    @property
    def digest(self) -> str:
        blob = json.dumps(self.parts, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:32]


def model_key(model: ModelEntry) -> ModelKey:
    """The key of ``model``; ValueError when its build function's source cannot be read."""
    module_name, _, name = model.build.partition(":")
    source = module_source(module_name)
    return ModelKey(
        {
            "build": model.build,
            "module_sha": _sha(source),
            "function_sha": _sha(function_source(source, name, model.build)),
            "world_size": model.world_size,
            "mode": model.mode,
            "dims": {k: _plain(v) for k, v in model.dims.items()},
            "inputs": [spec.model_dump(mode="json") for spec in model.inputs],
        }
    )


def module_source(module_name: str) -> str:
    """The source text of ``module_name``, found as an import would find it, without
    running its packages' ``__init__`` (which may import torch: the init container's
    full hit keys models without it); a package whose ``__init__`` adds the submodule
    to its path is imported as a last resort."""

    try:
        with working_folder_importable():
            found = find_spec(module_name)
            spec = importlib.util.find_spec(module_name) if isinstance(found, str) else found
    except (ImportError, ValueError) as e:
        raise ValueError(f"cannot import {module_name}: {named(e)}") from None
    if spec is None:
        raise ValueError(f"cannot import {module_name}: no module of that name")
    if not spec.origin or not spec.origin.endswith(".py"):
        raise ValueError(f"module {module_name} has no Python source to key its model by")
    return Path(spec.origin).read_text(encoding="utf-8")


def function_source(source: str, name: str, spec: str) -> str:
    """The top-level function ``name`` of a module's source, as its syntax tree (no
    line numbers: moving it in the file keeps its key); a name bound otherwise (an
    assignment, an import) is covered by the module's hash alone."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{spec!r}: its module does not parse: {e}") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return ast.dump(node, include_attributes=False)
    return f"not a top-level def: {name}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value
