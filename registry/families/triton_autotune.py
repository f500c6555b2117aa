"""Triton's own autotune results: the ``*.autotune.json`` files ``@triton.autotune``
writes with ``cache_results`` (``TRITON_CACHE_AUTOTUNING=1``), for the user functions a
manifest names.

They travel with Triton's cache folder (restored and saved as its files); what this
family adds is their import: at the run's end each result becomes a registry entry for
this host (:func:`registry.storage.importers.import_triton_autotune`), so the serving path and
the fleet read them as they read tuned configs. After ready, the sidecar harvests each
result the server's traffic writes (renamed into place): checked, to the volume and the
remote tier, and imported into the registry as a new generation.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import MappingProxyType

from registry.core import atomic
from registry.core.errors import RegistryError
from registry.core.explain import Prediction
from registry.families.base import Family, Host, Moved, Scope, Sources
from registry.families.file_harvest import FileLimits, Harvested, Refused, opened, read_at
from registry.families.triton_kernels import (
    TRITON_CACHE,
    check_folder,
    in_a_cache_folder,
    origin_of,
    record,
    result,
    triton_prediction,
    uploads,
    write_new,
)
from registry.storage.importers import import_triton_autotune, import_triton_autotune_files

log = logging.getLogger(__name__)
MAX_AUTOTUNE_BYTES = 2**20


class TritonAutotune(Family):
    name = "triton-autotune"
    order = 30
    folders = (TRITON_CACHE,)  # its results live in Triton's cache folder
    file_kinds = MappingProxyType({"autotune": "triton-autotunes"})

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

    def file_folders(self, scope: Scope) -> list[Path]:
        return [scope.folder(TRITON_CACHE.name)]

    def file_kind(self, scope: Scope, path: Path) -> str | None:
        """An autotune result (``<hash>/<fn>.autotune.json``, written by rename)."""
        if in_a_cache_folder(scope, path) and path.name.endswith(".autotune.json"):
            return "autotune"
        return None

    def harvest_file(self, scope: Scope, kind: str, path: Path, limits: FileLimits) -> Harvested:
        """A result that parses as one, to the volume and shared; a new one also
        imported into the registry."""
        if kind != "autotune":
            return super().harvest_file(scope, kind, path, limits)
        folder = path.parent
        check_folder(scope, folder)
        with opened(folder) as at:
            data = read_at(at, path.name, MAX_AUTOTUNE_BYTES)
        try:
            parsed = atomic.loads(data)
            if not isinstance(parsed.get("configs_timings"), list):
                raise ValueError("no configs_timings list")
        except (ValueError, AttributeError) as e:
            raise Refused(f"not an autotune result: {e}") from None
        target = scope.volume.triton_cache / folder.name
        new = write_new(target, {path.name: data})
        record(scope, origin_of(scope), folder.name)
        if new:
            _import(scope, target / path.name)
        return Harvested(result(new), len(data), uploads(folder.name, {path.name: data}))


def _import(scope: Scope, path: Path) -> None:
    """An autotune result into the registry: a new generation, under its lock."""
    assert scope.fingerprint is not None  # origin_of refused a harvest without it
    found = import_triton_autotune_files([path], scope.fingerprint)
    if found.entries:
        try:
            scope.store().put_many(found.entries)
        except (OSError, RegistryError) as e:
            log.warning("harvest: %s not put in the registry: %s", path.name, e)


FAMILY = TritonAutotune()
