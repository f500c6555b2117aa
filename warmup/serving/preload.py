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

Inductor's CUDA-graph trees keep their state per thread, made when their module is
imported: on torch 2.11 a thread that did not import it fails a bare ``assert`` at its
first CUDA graph (``max-autotune``, ``reduce-overhead``). That module is imported, or
its state made, on the thread that waits (:data:`GRAPH_TREES`).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from warmup.core.manifest import ManifestError, load_manifest

if TYPE_CHECKING:
    from warmup.core.settings import Settings

log = logging.getLogger(__name__)

# What the first compile imports, in the order it needs them.
MODULES = (
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
)
GRAPH_TREES = "torch._inductor.cudagraph_trees"  # per-thread state: see the module's doc


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
        from warmup.serving.models import use_inductor_cache  # on the preload thread, beside the se

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
        """Until the imports are done, then the CUDA-graph trees' state made for the
        calling thread (never raises: a failed import is the compile's to report)."""
        self._thread.join(timeout_s)
        if self.error:
            log.debug("compiler preload stopped at %s", self.error)
        if self._thread.is_alive():
            log.warning(
                "the compiler's imports still run after %.0f s: a first CUDA graph on this "
                "thread may fail on torch 2.11 (its per-thread state is made at import)",
                timeout_s,
            )
        else:
            try:
                graph_trees_here()
            except Exception as e:  # another torch's internals: its first graph says why
                log.debug("CUDA-graph trees' state not made here: %s", e)


def graph_trees_here() -> None:
    """Import :data:`GRAPH_TREES` on this thread, or, when another thread imported it
    first (a preloaded module of another torch may), make its per-thread state here as
    its import does (torch 2.11 asserts where it is missing; later ones make it)."""
    module = importlib.import_module(GRAPH_TREES)
    local = getattr(module, "local", None)
    if local is None or hasattr(local, "tree_manager_containers"):
        return
    initialize = getattr(module, "_initialize_tls", None)
    if initialize is not None:
        initialize(local)
        return
    torch = sys.modules["torch"]
    if torch._C._is_key_in_tls("tree_manager_containers"):
        return  # handed over to this thread (autograd's threads are)
    local.tree_manager_containers = {}
    local.tree_manager_locks = defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", local.tree_manager_locks)


def declares_models(manifest: Path) -> bool:
    """Whether the manifest at ``manifest`` declares a compiled model; False when there
    is none or it cannot be read (the server's own calls say why)."""

    try:
        return bool(load_manifest(manifest).models)
    except (ManifestError, OSError, ValueError):
        return False


def compiles_models(settings: Settings) -> bool:
    """Whether the settings' manifest declares a model this server will compile: one
    served through ``torch.compile``, or ``auto`` with no usable package in this pod
    (read without importing the compiler); False when the manifest cannot be read."""
    from warmup.serving.packaged import usable  # the package path's own check

    try:
        models = load_manifest(settings.paths.manifest).models
    except (ManifestError, OSError, ValueError):
        return False
    default = settings.models.serve
    return any(
        m.served_as(default) == "compiled"
        or (m.served_as(default) == "auto" and isinstance(usable(m, settings), str))
        for m in models
    )
