"""A declared model built without the compiler: what its build function hands to
``torch.compile``, and how it asked.

A package is the model's compiled code, made ahead of time (``warmup.compiled.package``),
so the process that exports it and the server that loads it need the model's module
with its weights, not a ``torch.compile`` wrapper, and the server must not import
Dynamo at all (``import torch._dynamo`` is seconds). While the build function runs under
:func:`build_uncompiled`, ``torch.compile`` is a stand-in that returns what it is given,
unchanged, and records the options it was called with (``mode``, ``options``,
``backend``...): the package is compiled with them. A build that calls ``torch.compile``
more than once, on something other than what it returns, or with another backend than
Inductor cannot be packaged (:attr:`Uncompiled.unpackaged` says why).

The stand-in is process-wide for the build's duration (a lock keeps builds apart): a
server builds its models at start, before it serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from registry.core.errors import first_line
from warmup.core.manifest import ModelEntry, resolve_model_builder

_building = threading.Lock()


@dataclass
class Uncompiled:
    """What a build returned with ``torch.compile`` stood in for: the ``model`` (what
    it returned, uncompiled), each ``torch.compile`` call's keyword arguments, and
    whether the model was one of them."""

    model: Any
    calls: list[dict[str, Any]] = field(default_factory=list)
    compiled_model: bool = False

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments ``torch.compile`` was given for the model ({} if none)."""
        return dict(self.calls[0]) if self.calls else {}

    @property
    def unpackaged(self) -> str:
        """Why this model cannot become a package ('' when it can)."""
        import torch  # torch loads on first use

        if len(self.calls) > 1:
            return f"its build calls torch.compile {len(self.calls)} times (one model, one package)"
        if self.calls and not self.compiled_model:
            return "its build returns something other than what it hands torch.compile"
        backend = self.options.get("backend", "inductor")
        if backend != "inductor":
            return f"it is compiled with backend {backend!r}: a package is Inductor's"
        if not isinstance(self.model, torch.nn.Module):
            return (
                f"its build returns a {type(self.model).__name__}, not a torch.nn.Module "
                "(torch.export takes a module, whose weights the server gives the package)"
            )
        return ""


def build_uncompiled(entry: ModelEntry, device: Any) -> Uncompiled:
    """``entry``'s build called on ``device`` with ``torch.compile`` stood in for;
    ValueError when the build raises or returns no callable."""
    calls: list[tuple[Any, dict[str, Any]]] = []
    with _building, _stand_in(calls):
        model = call_build(entry, device)
    return Uncompiled(
        model,
        [options for _, options in calls],
        compiled_model=any(given is model for given, _ in calls),
    )


def module_tensor(module: Any, name: str) -> Any:
    """The tensor at ``name`` in ``module`` (a parameter, a buffer or a tensor attribute,
    by its dotted name as ``torch.export`` gives it); None when there is none."""
    import torch  # torch loads on first use

    owner, _, leaf = name.rpartition(".")
    try:
        found = getattr(module.get_submodule(owner) if owner else module, leaf)
    except AttributeError:
        return None
    return found if isinstance(found, torch.Tensor) else None


def call_build(entry: ModelEntry, device: Any) -> Callable[..., Any]:
    """The callable ``entry.build(device=...)`` returns; ValueError saying why there is none."""
    build = resolve_model_builder(entry.build)
    try:
        function = build(device=device)
    except Exception as e:
        raise ValueError(f"{entry.build}(device=...) raised {first_line(e)}") from e
    if not callable(function):
        kind = type(function).__name__
        raise ValueError(f"{entry.build}(device=...) returned {kind}, not a callable")
    return function  # type: ignore[no-any-return]


@contextmanager
def _stand_in(calls: list[tuple[Any, dict[str, Any]]]) -> Iterator[None]:
    """``torch.compile`` recording its calls into ``calls`` and returning its argument
    (used as a decorator too: ``@torch.compile(mode=...)``)."""
    import torch  # torch loads on first use

    real = torch.compile

    def compile(model: Any = None, **options: Any) -> Any:
        if model is None:  # @torch.compile(...) on a function

            def decorate(function: Callable[..., Any]) -> Any:
                calls.append((function, options))
                return function

            return decorate
        calls.append((model, options))
        return model

    torch.compile = compile  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real
