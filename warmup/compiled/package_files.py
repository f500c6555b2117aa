"""A model's package folder, as the warmup writes it and the server reads it (no torch).

``<package_dir>/<model>/`` holds either the package and what it is::

    model.pt2       the AOTInductor package (torch.export, compiled for this host)
    package.json    :class:`PackageInfo`: its key, versions, dims' ranges, inputs, weights

or why the model has none (``failed.json``: :class:`PackageFailed`), so that the next pods
serve it through ``torch.compile`` at once instead of exporting it again. The folder is
the ``packages`` family's unit (``registry.families.packages``): stored, bundled and shared
whole. Each file is written atomically, the package first and what describes it last: a
folder with a package and no ``package.json`` is unfinished and reads as none.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from registry.core import atomic

PACKAGE = "model.pt2"
INFO = "package.json"
FAILED = "failed.json"
MAX_INFO_BYTES = 1 << 20  # a package.json lists its constants' names: bounded all the same


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a newer writer's fields read too

    def write(self, folder: Path, name: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        atomic.write_bytes(path, self.model_dump_json(indent=1).encode())
        return path


class PackageInfo(_Record):
    """What a package is: made for ``key_digest`` by ``torch`` and ``triton`` on
    ``device`` (``gpu``), serving ``ranges`` of each dim for ``inputs``; its weights come
    from the server's module (``module``: ``constants`` names them) or with it
    (``package``); ``cuda_graphs``: the model's mode asked for them; ``options``: the
    Inductor settings it was compiled with."""

    name: str
    key_digest: str
    torch: str
    triton: str
    device: str  # "cuda" or "cpu"
    gpu: str = ""
    mode: str = "no_grad"
    ranges: dict[str, tuple[int, int]] = {}
    inputs: list[dict[str, Any]] = []
    weights: Literal["module", "package"] = "module"
    constants: list[str] = []
    cuda_graphs: bool = False
    options: dict[str, Any] = {}
    export_s: float = 0.0
    compile_s: float = 0.0
    made: float = 0.0  # when, by the making pod's clock


class PackageFailed(_Record):
    """Why a model has no package for ``key_digest`` on this host: the ``stage`` that
    failed (build, export, compile) and its one-line ``reason``."""

    name: str
    key_digest: str
    torch: str
    stage: str
    reason: str
    made: float = 0.0


def write_info(folder: Path, info: PackageInfo) -> Path:
    """``info`` beside the package (written last: the folder is whole from here), and
    any earlier failure's record gone."""
    path = info.model_copy(update={"made": info.made or time.time()}).write(folder, INFO)
    (folder / FAILED).unlink(missing_ok=True)
    return path


def write_failed(folder: Path, failed: PackageFailed) -> Path:
    """Why there is no package, in place of one (an unfinished package removed)."""
    for stale in (INFO, PACKAGE):
        (folder / stale).unlink(missing_ok=True)
    return failed.model_copy(update={"made": failed.made or time.time()}).write(folder, FAILED)


def read(folder: Path) -> PackageInfo | PackageFailed | None:
    """What ``folder`` holds: a whole package's info, a failure, or None (nothing, an
    unfinished package, an unreadable record: a miss, never an error)."""
    try:
        if (folder / INFO).is_file() and (folder / PACKAGE).is_file():
            return PackageInfo.model_validate_json(
                atomic.read_bounded(folder / INFO, MAX_INFO_BYTES)
            )
        if (folder / FAILED).is_file():
            return PackageFailed.model_validate_json(
                atomic.read_bounded(folder / FAILED, MAX_INFO_BYTES)
            )
    except (OSError, ValidationError, ValueError):
        return None
    return None
