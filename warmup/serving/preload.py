"""The compiler's imports, started when the server starts.

A server's first ``torch.compile`` call imports Dynamo and Inductor (seconds on a warm
cache: 8.7 to 11.7 s of a 15 s ready time went to that first call, imports and tracing,
in issue [4.1]'s measurement). Nothing about those imports depends on the model, so
``Serving()`` starts them on a thread when the manifest declares a compiled model, and
they run beside what the server does next (its ops, its own weights); ``Serving.model``
waits for them before it builds the model: two threads importing Dynamo at once can
see it half made, so a server's own code that imports it first calls
``serving.preload.wait()``. The pod's Inductor environment
(``warmup.serving.models.use_inductor_cache``) is set first, since Inductor reads its
knobs when its config is imported.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmup.settings import Settings

log = logging.getLogger(__name__)

# What the first compile imports, in the order it needs them.
MODULES = (
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "torch._inductor.cudagraph_trees",
)


class Preload:
    """The pod's Inductor environment set, then the imports of :data:`MODULES`, on a
    daemon thread."""

    def __init__(self, settings: Settings, modules: tuple[str, ...] = MODULES) -> None:
        self.settings, self.modules = settings, modules
        self.seconds = 0.0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="compiler-preload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from warmup.serving.models import use_inductor_cache

        started = time.perf_counter()
        try:
            use_inductor_cache(self.settings)
        except Exception as e:  # Serving.model sets it again, and says why
            self.error = f"the Inductor environment: {type(e).__name__}: {e}"
            return
        for name in self.modules:
            try:
                importlib.import_module(name)
            except Exception as e:  # the first compile imports it again, and says why
                self.error = f"{name}: {type(e).__name__}: {e}"
                break
        self.seconds = time.perf_counter() - started

    def wait(self, timeout_s: float = 300.0) -> None:
        """Until the imports are done (never raises: a failed import is the compile's
        to report)."""
        self._thread.join(timeout_s)
        if self.error:
            log.debug("compiler preload stopped at %s", self.error)


def declares_models(manifest: Path) -> bool:
    """Whether the manifest at ``manifest`` declares a compiled model; False when there
    is none or it cannot be read (the server's own calls say why)."""
    from warmup.manifest import ManifestError, load_manifest

    try:
        return bool(load_manifest(manifest).models)
    except (ManifestError, OSError, ValueError):
        return False
