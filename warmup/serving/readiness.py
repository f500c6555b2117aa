"""This serving process's word to the sidecar's readiness: a rank is warm once its server
declares it (``ServerWarm``, read with ``ready_after_server``), and from then on every
Triton compile or autotune run is counted or refused by the compile guard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from warmup.core.manifest import Manifest, ManifestError
from warmup.core.results import ServerWarm
from warmup.serving.compile_guard import CompileGuard


class Readiness:
    """One rank's warm marker in ``metrics_dir``: withdrawn when made (a server started
    again in the same pod is not warm until it says so again), written by :meth:`declare`."""

    def __init__(
        self,
        metrics_dir: Path,
        rank: str,
        *,
        guard: CompileGuard | None,
        manifest: Callable[[], Manifest],
        flush: Callable[[], None],
    ) -> None:
        """``manifest`` gives the declared manifest (its digest goes in the marker);
        ``flush`` writes the process's metrics before the marker is written."""
        self.metrics_dir, self.rank, self.guard = metrics_dir, rank, guard
        self._manifest, self._flush = manifest, flush
        self.withdraw()

    def declare(self) -> None:
        """Arm the guard, write the metrics, then mark this rank warm."""
        if self.guard is not None:
            self.guard.arm()
        self._flush()
        try:
            digest = self._manifest().digest()
        except (ManifestError, OSError):
            digest = ""  # a server without a manifest: its ops only
        warm = ServerWarm(rank=self.rank, manifest_digest=digest, declared=time.time())
        warm.write(self.metrics_dir)

    def withdraw(self) -> None:
        """This rank is no longer warm."""
        ServerWarm.path(self.metrics_dir, self.rank).unlink(missing_ok=True)
