"""Compiled packages of each declared model: an AOTInductor package (``torch.export``
with the manifest's dims dynamic, compiled to a shared library for this host) that the
server loads in milliseconds without importing the compiler (``warmup.serving.packaged``).

Each model's package folder (``<package_dir>/<model>``: ``model.pt2`` and its
``package.json``, or a ``failed.json`` saying why the model does not export) is kept on
the volume at ``<volume>/packages`` by model, key and host, like Inductor's artifacts
(:mod:`registry.caches.inductor_cache`'s layout), bundled, signed, shared through the
remote tier under its own namespace, explained and harvested. A failure is stored too:
the next pods serve the model through ``torch.compile`` at once instead of trying the
export again. The weights stay out of the package unless the manifest asks
(``package_weights``): the server's own module gives them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from registry.caches import inductor_cache
from registry.core import atomic
from registry.core.explain import Prediction
from registry.core.volume import Volume
from registry.families.base import BundleOption, Declared, Host, PodFolder, Scope, Sources
from registry.families.bundle_indexed import IndexedFiles
from registry.families.keyed import KeyedFolders

FAILED = "failed.json"  # warmup.compiled.package_files: why a model has no package
MAX_FAILED_BYTES = 1 << 16
RECORD_KEY = "package_indexes"  # a generation's record: the indexes its install replaced
NAMESPACE = "package"  # its indexes on the remote tier
PACKAGE_DIR = PodFolder(
    "package_dir",
    "families/packages",
    "compiled packages of the declared models (AOTInductor), one folder per model, where "
    "the server loads them from",
)


class Packages(KeyedFolders):
    name = "packages"
    order = 45
    folders = (PACKAGE_DIR,)
    namespace = NAMESPACE
    remade = "to export again"
    nothing_declared = "no models declared"
    bundled = IndexedFiles("packages/", RECORD_KEY, "packages", "compiled package", per_name=True)
    option = BundleOption(
        "--packages",
        carries="also carry the compiled packages stored in this family (<volume>/packages)",
        goes="the family where compiled packages go",
    )

    def volume_root(self, volume: Volume) -> Path:
        return volume.packages

    def declared(self, scope: Scope) -> Sequence[Declared]:
        return scope.models

    def folder(self, scope: Scope, item: Declared) -> Path:
        return scope.folder(PACKAGE_DIR.name) / item.name

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        """As every keyed family's, and each model stored for this host with no package
        but the record of why (served through ``torch.compile``) named with its reason."""
        prediction = super().explain(scope, host, sources)
        if scope.fingerprint is None:
            return prediction
        failed = [
            f"{item.name}: no package ({why}), served through torch.compile"
            for item in self.declared(scope)
            if not item.error and (why := self.why_none(scope, item))
        ]
        note = "; ".join(filter(None, [prediction.note, *failed]))
        return dataclasses.replace(prediction, note=note)

    def why_none(self, scope: Scope, item: Declared) -> str:
        """Why ``item`` has no package for this host, where what is stored is the record
        of a failure; '' otherwise (a package, or nothing stored)."""
        files = self.stored_files(scope, item)
        if FAILED not in files or len(files) != 1:
            return ""
        sha = str(files[FAILED][0])
        try:
            blob = atomic.read_bounded(
                inductor_cache.blob_path(self.root(scope), sha), MAX_FAILED_BYTES
            )
            record = json.loads(blob)
        except (OSError, ValueError):
            return "the warmup could not make one"
        return f"{record.get('stage', '?')} failed: {str(record.get('reason', ''))[:200]}"


FAMILY = Packages()
