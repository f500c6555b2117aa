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

from collections.abc import Sequence
from pathlib import Path

from registry.core.volume import Volume
from registry.families.base import BundleOption, Declared, PodFolder, Scope
from registry.families.bundle_indexed import IndexedFiles
from registry.families.keyed import KeyedFolders

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


FAMILY = Packages()
