"""Triton's own autotune results: the ``*.autotune.json`` files ``@triton.autotune``
writes with ``cache_results`` (``TRITON_CACHE_AUTOTUNING=1``), for the user functions a
manifest names.

They travel with Triton's cache folder (restored and saved as its files); what this
family adds is their import: at the run's end each result becomes a registry entry for
this host (:func:`registry.importers.import_triton_autotune`), so the serving path and
the fleet read them as they read tuned configs.
"""

from __future__ import annotations

import logging

from registry.explain import Prediction
from registry.families.base import Family, Host, Moved, Scope, Sources
from registry.families.triton_kernels import TRITON_CACHE, triton_prediction
from registry.importers import import_triton_autotune

log = logging.getLogger(__name__)


class TritonAutotune(Family):
    name = "triton-autotune"
    order = 30
    folders = (TRITON_CACHE,)  # its results live in Triton's cache folder

    def save(self, scope: Scope) -> Moved:
        """The results in this pod's cache into the registry (user functions only)."""
        if scope.fingerprint is None or not scope.user_functions:
            return Moved(self.name)
        result = import_triton_autotune(scope.folder(TRITON_CACHE.name), scope.fingerprint)
        for error in result.errors:
            log.warning("could not import %s", error)
        scope.store().put_many(result.entries)
        return Moved(self.name, entries=len(result.entries))

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        local = Sources(sources.bundles, None, sources.local)  # the remote tier is not sampled
        return triton_prediction(self.name, "autotune", scope, host, local)


FAMILY = TritonAutotune()
