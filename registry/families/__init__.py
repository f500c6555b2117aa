"""The cache families: each one module in this folder, behind one protocol.

A pod's warm state is several caches, each a *family*: tuned configs, Triton's compiled
kernels, Triton's autotune results, Inductor's artifacts of declared models, declared
folders (an engine's own cache root). Each module here defines ``FAMILY``, an instance
of a :class:`~registry.families.base.Family` subclass: how the family is restored into
the pod, saved onto the volume, explained, and what label its metrics carry. The loops
that use them (the run's restore and save, ``explain``) call :func:`every` and name
none, so adding a family is its module and its test.

Imports no torch or triton: the modules are found by name and imported on first use.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from registry.families.base import Family, Host, Moved, Scope, Sources

__all__ = ["Family", "Host", "Moved", "Scope", "Sources", "every", "named"]


@cache
def every() -> tuple[Family, ...]:
    """Every family of this folder, in their ``order`` (then by name)."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base" or module.name.startswith("_"):
            continue
        family = getattr(importlib.import_module(f"{__name__}.{module.name}"), "FAMILY", None)
        if isinstance(family, Family):
            found.append(family)
    return tuple(sorted(found, key=lambda f: (f.order, f.name)))


def named(name: str) -> Family:
    """The family called ``name``; KeyError naming the ones there are."""
    for family in every():
        if family.name == name:
            return family
    raise KeyError(f"no cache family '{name}'; there are {', '.join(f.name for f in every())}")
