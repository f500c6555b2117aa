"""The cache families: each one module in this folder, behind one protocol.

A pod's warm state is several caches, each a *family*: tuned configs, Triton's compiled
kernels, Triton's autotune results, Inductor's artifacts of declared models, declared
folders (an engine's own cache root). Each module here defines ``FAMILY``, an instance
of a :class:`~registry.families.base.Family` subclass: how the family is restored into
the pod, saved onto the volume, harvested, explained, what label its metrics carry, and
what it declares: its pod folders (their settings, the chart's mounts, the scope it is
handed: :func:`pod_folders`) and its option in the bundle commands. The loops that use
them (the run's restore and save, the harvest, bundles, ``explain``, the settings, the
CLI) call :func:`every` and name none, so adding a family is its module and its test.
A family module outside this folder is found once its folder is on this package's
``__path__`` (``pkgutil.extend_path``'s way; the tests add one so).

Imports no torch or triton: the modules are found by name and imported on first use.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from registry.families.base import (
    BundleOption,
    Declared,
    Family,
    Host,
    Moved,
    PodFolder,
    Scope,
    Sources,
)
from registry.families.keyed import KeyedFolders

__all__ = [
    "BundleOption", "Declared", "Family", "Host", "Moved", "PodFolder", "Scope", "Sources",
    "every", "models", "named", "package_family", "pod_folders", "with_option",
]  # fmt: skip


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


def pod_folders() -> tuple[PodFolder, ...]:
    """Every pod folder the families declare, once each, in the families' order (two
    families may share one, as Triton's kernels and autotune results share its cache)."""
    found: dict[str, PodFolder] = {}
    for family in every():
        for folder in family.folders:
            if found.setdefault(folder.name, folder) != folder:
                raise ValueError(f"pod folder '{folder.name}' is declared twice, differently")
    return tuple(found.values())


def with_option() -> tuple[Family, ...]:
    """The families the bundle commands name by an option of their own, in order."""
    return tuple(f for f in every() if f.option is not None and f.bundled is not None)


def models() -> KeyedFolders:
    """The family that keeps each declared model's compiled artifacts (the run's full
    hit and a bundle's hot reload restore them one model at a time)."""
    family = named("inductor")
    assert isinstance(family, KeyedFolders), family
    return family


def package_family() -> KeyedFolders:
    """The family that keeps each declared model's compiled package (the run makes and
    restores them one model at a time)."""
    family = named("packages")
    assert isinstance(family, KeyedFolders), family
    return family
