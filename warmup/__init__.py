"""Turns a shape manifest into warm state: no request pays for compiling or tuning.

``warm(manifest, settings=None)`` warms inside the calling process (every rank of an
initialised torch.distributed group calls it); ``triton-warmup run`` does the same in
an init container. Importing this package imports neither torch nor triton.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmup.core.manifest import Manifest
    from warmup.core.results import RunStatus
    from warmup.core.settings import Settings


def warm(manifest: Manifest | str | Path, settings: Settings | None = None) -> RunStatus:
    """Warm every shape of ``manifest`` in this process; returns the run's status (every
    rank gets it; ``status.ready`` is True only when every shape is warm).

    Under an initialised ``torch.distributed`` group every rank must call it; rank 0
    restores and saves the compile cache and writes the status and metrics files. On
    CPU it turns Triton's interpreter on (before the kernels are imported).
    :class:`~warmup.core.manifest.ManifestError` when the manifest has no entry for this
    world size or a kernel rejects a shape; :class:`~warmup.run.checks.RunError` when the
    device asked for is not there; :class:`registry.core.volume.MissingFolder` when the volume
    is not there (``Settings(create_volume=True)`` makes it).
    """
    from warmup.run.inprocess import warm_in_process  # import warmup stays light

    return warm_in_process(manifest, settings)
