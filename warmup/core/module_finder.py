"""A user's ``package.module:function``, found and checked before anything runs it.

A manifest names functions the run will call: a warm function (``kernel:``) and a
model's builder (``build:``). :func:`find_function` checks one without running any of
the user's code (``triton-warmup validate``, the launcher before its ranks start): the
module is found as an import would find it and its source read, not run.
:func:`import_callable` imports it and checks its signature, where a run imports it
anyway. Both say what is wrong as a ValueError.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from typing import Any

# What in a module's source can bind a name, or a package's submodules, only at run time:
# then a name its source does not bind is left to the run's import, not refused.
RUN_TIME_BINDERS = ("globals(", "setattr(", "global ", "__getattr__", "import *", "exec(", "vars(")


def find_function(spec: str, keywords: Sequence[str]) -> str | None:
    """Check ``package.module:function`` as :func:`import_callable` does, without
    running any of the user's code: the module is found as an import would find it (no
    package's ``__init__`` runs) and its source read through its loader (a zip path
    too). ValueError when its top-level package is not there, its source does not parse
    or the ``def`` found refuses the call. What only running code could judge passes,
    with a note saying why (None when checked): a submodule a package's ``__init__`` may
    add (``__path__`` extended), a function imported, assigned, decorated or bound at run
    time (``globals()``, ``setattr``, ``global``), a module without Python source. The
    run imports it and checks it before tuning. A module imported already is asked
    directly."""
    module_name, _, name = spec.partition(":")
    if module_name in sys.modules:
        _check_callable(_imported(module_name, name), name, keywords)
        return None
    with working_folder_importable():
        found = find_spec(module_name)
    if isinstance(found, str):
        return found
    tree = _source_tree(module_name, found)
    if tree is None:
        return f"module {module_name} has no Python source to read"
    if not any(name in _bound_names(node) for node in _module_scope(tree)):
        if not _may_bind_at_run_time(ast.unparse(tree), RUN_TIME_BINDERS):
            raise ValueError(f"module {module_name} has no attribute {name!r}")
        return f"module {module_name} binds no {name!r} in its source (it may at run time)"
    definition = _definition(tree, name)
    if definition is not None:
        _check_call(name, _signature(definition.args), keywords)
    return None


def import_callable(spec: str, keywords: Sequence[str]) -> Callable[..., Any]:
    """``package.module:function`` -> the function, imported as the ranks import it and
    checked to take a call with ``keywords`` alone; ValueError, naming ``spec``, saying
    why not."""
    module_name, _, name = spec.partition(":")
    try:
        function = _imported(module_name, name)
        _check_callable(function, name, keywords)
    except ValueError as e:
        raise ValueError(f"{spec!r}: {e}") from None
    return function


def find_spec(module_name: str) -> ModuleSpec | str:
    """The spec an import of ``module_name`` would load, from ``sys.meta_path``'s
    finders, each parent package's ``__path__`` read from its spec, not run. ValueError
    when the top-level package is not there; a note (str) when a submodule is not found
    this way (its package's ``__init__`` may extend ``__path__``)."""
    parts = module_name.split(".")
    path: list[str] | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None) if module is not None else _find(name, path)
        if spec is None and depth == 1:
            raise ValueError(
                f"cannot import {module_name}: ModuleNotFoundError: No module named {name!r}"
            )
        if spec is None:
            parent = ".".join(parts[: depth - 1])
            if not _may_bind_at_run_time(_parent_source(parent), ("__path__",)):
                raise ValueError(
                    f"cannot import {module_name}: ModuleNotFoundError: No module named {name!r}"
                )
            return f"no module {name!r} found without running its package's __init__"
        if depth == len(parts):
            return spec
        path = (
            getattr(module, "__path__", None)
            if module is not None
            else spec.submodule_search_locations
        )
        if path is None:
            return f"{name!r} is not a package without running it"
    raise AssertionError("unreachable: a module name has at least one part")


@contextlib.contextmanager
def working_folder_importable() -> Iterator[None]:
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


def _imported(module_name: str, name: str) -> Callable[..., Any]:
    """The callable ``name`` of ``module_name``, imported; ValueError saying why not."""
    try:
        with working_folder_importable():
            module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raises at import
        raise ValueError(f"cannot import {module_name}: {type(e).__name__}: {e}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"module {module_name} has no function {name!r}")
    return function  # type: ignore[no-any-return]


def _check_callable(function: Callable[..., Any], name: str, keywords: Sequence[str]) -> None:
    try:
        signature = inspect.signature(function)
    except ValueError:  # no signature to read (a builtin): its call will tell
        return
    _check_call(name, signature, keywords)


def _check_call(name: str, signature: inspect.Signature, keywords: Sequence[str]) -> None:
    """ValueError when ``name{signature}`` refuses a call with ``keywords`` alone."""
    try:
        signature.bind(**dict.fromkeys(keywords))
    except TypeError as e:
        call = ", ".join(f"{keyword}=..." for keyword in keywords)
        raise ValueError(
            f"a warmup calls it as {name}({call}), which its signature {name}{signature} "
            f"refuses: {e}"
        ) from None


def _may_bind_at_run_time(source: str | None, markers: Sequence[str]) -> bool:
    """Whether ``source`` (None: unreadable, so unknown) holds any of ``markers``."""
    return source is None or any(marker in source for marker in markers)


def _parent_source(package: str) -> str | None:
    """The source of ``package``'s ``__init__`` (None when it has none to read: a
    namespace package has none, and cannot extend its path, so "" is returned)."""
    if "." in package:  # a nested package: not read here, left to the run
        return None
    spec = sys.modules[package].__spec__ if package in sys.modules else _find(package, None)
    if spec is None:
        return None
    if spec.loader is None or spec.origin is None:  # a namespace package: no __init__
        return ""
    try:
        return _loader_source(spec)
    except (OSError, ValueError):
        return None


def _loader_source(spec: ModuleSpec) -> str | None:
    """The source an import of ``spec`` would run, read through its loader as an import
    reads it (a file, a zip archive; "" for an empty one); None when it has none (an
    extension module, a frozen or compiled-only one). OSError or ValueError when it
    cannot be read."""
    get_source = getattr(spec.loader, "get_source", None)
    if get_source is None:
        return None
    try:
        source: str | None = get_source(spec.name)
    except ImportError:  # the loader's "no source here"
        return None
    return source


def _find(name: str, path: list[str] | None) -> ModuleSpec | None:
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        found = find_spec(name, path) if find_spec is not None else None
        if found is not None:
            return found  # type: ignore[no-any-return]
    return None


def _source_tree(module_name: str, spec: ModuleSpec) -> ast.Module | None:
    """The module's parsed source, read through its loader as an import reads it (a
    file, a zip archive); None when it has none to read (an extension module, a
    namespace package, a frozen or compiled-only one)."""
    try:
        source = _loader_source(spec)
    except (OSError, ValueError) as e:  # ValueError: undecodable bytes
        raise ValueError(f"cannot import {module_name}: {type(e).__name__}: {e}") from None
    if not source:
        return None
    try:
        return ast.parse(source, spec.origin or module_name)
    except (SyntaxError, ValueError) as e:  # ValueError: a null byte
        raise ValueError(f"cannot import {module_name}: {type(e).__name__}: {e}") from None


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_OWN_SCOPES = (*_FUNCTIONS, ast.ClassDef, ast.Lambda, *_COMPREHENSIONS)


def _definition(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The plain ``def`` that alone binds ``name`` at the top of the module: its
    signature is the one a call meets. None when something else binds it or may (an
    import, an assignment, a decorator): only running the module could tell."""
    binders = [node for node in _module_scope(tree) if name in _bound_names(node)]
    (only, *others) = binders
    if others or not isinstance(only, _FUNCTIONS) or only.decorator_list or only not in tree.body:
        return None
    return only


def _module_scope(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node of the module's own scope: not inside a function, class, lambda or
    comprehension (those bind their own names)."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _OWN_SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _bound_names(node: ast.AST) -> set[str]:
    """The names ``node`` binds in the scope it is in ("*" for a star import)."""
    if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return {node.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {alias.asname or alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return {node.name}
    if isinstance(node, ast.MatchMapping) and node.rest:
        return {node.rest}
    return set()


class _Source(str):
    """A default value as its source text, shown bare in a signature."""

    def __repr__(self) -> str:
        return str(self)


def _signature(args: ast.arguments) -> inspect.Signature:
    """The signature a ``def``'s arguments make, defaults shown as written."""
    kind = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    params = [
        kind(
            arg.arg,
            kind.POSITIONAL_ONLY if i < len(args.posonlyargs) else kind.POSITIONAL_OR_KEYWORD,
            default=kind.empty if default is None else _Source(ast.unparse(default)),
        )
        for i, (arg, default) in enumerate(
            zip(positional, [*defaults, *args.defaults], strict=True)
        )
    ]
    if args.vararg:
        params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
    params += [
        kind(
            arg.arg,
            kind.KEYWORD_ONLY,
            default=kind.empty if default is None else _Source(ast.unparse(default)),
        )
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(params)
