"""The layout of the mounted volume that carries state between pods and restarts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import overload

from registry.core.errors import BadInput


class _Subfolder:
    """A read-only :class:`Volume` attribute: the folder ``name`` below its root."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, volume: None, owner: type[Volume]) -> _Subfolder: ...
    @overload
    def __get__(self, volume: Volume, owner: type[Volume]) -> Path: ...
    def __get__(self, volume: Volume | None, owner: type[Volume]) -> _Subfolder | Path:
        return self if volume is None else volume.root / self.name


@dataclass(frozen=True)
class Volume:
    """``<root>/registry`` (the store), ``<root>/triton-cache`` (compile artifacts),
        ``<root>/inductor`` (compiled models' artifacts), ``<root>/packages`` (their compiled
        packages), ``<root>/locks`` (file leases),
        ``<root>/bundles`` (archives to install), ``<root>/learned`` (compiled models' shapes
        met under traffic), ``<root>/hosts`` (what warm runs learned of each kind of host:
    ``registry.storage.hosts``)."""

    root: Path

    registry = _Subfolder("registry")
    triton_cache = _Subfolder("triton-cache")
    inductor = _Subfolder("inductor")
    packages = _Subfolder("packages")
    locks = _Subfolder("locks")
    bundles = _Subfolder("bundles")
    learned = _Subfolder("learned")
    hosts = _Subfolder("hosts")


class MissingFolder(BadInput, ValueError):
    """A volume or store folder that is not there and was not asked to be created: a
    mistyped path must not start an empty one (and tune everything again)."""


def existing_folder(path: Path, *, what: str, create: bool, fix: str) -> Path:
    """``path`` when it is a folder; made first when ``create``. :class:`MissingFolder`
    otherwise, one line naming ``what``, the path and ``fix`` (how to create it)."""
    if path.is_dir():
        return path
    if path.exists():
        raise MissingFolder(f"{what} '{path}' is a file; expected a folder")
    if not create:
        raise MissingFolder(f"{what} '{path}' does not exist; {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MissingFolder(f"{what} '{path}' cannot be created: {e.strerror or e}") from None
    return path
