"""Inductor's artifacts of each declared model: what ``torch.compile`` wrote while the
model warmed (FX graph, AOTAutograd and autotune entries, generated code, kernels),
kept on the volume at ``<volume>/inductor`` by model, key and host
(:mod:`registry.caches.inductor_cache`).

A rank restores and saves a model's artifacts around its compile (``warmup.compiled``);
a run that starts no rank (a full hit) restores them here, for the server. The key is
the model's (its code and shapes: ``warmup.compiled.key``); the remote tier shares them
(:mod:`registry.remote.models`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from registry.core.volume import Volume
from registry.families.base import BundleOption, Declared, PodFolder, Scope
from registry.families.bundle_indexed import IndexedFiles
from registry.families.keyed import KeyedFolders
from registry.remote import models as remote_models

RECORD_KEY = "inductor_indexes"  # a generation's record: the indexes its install replaced
INDUCTOR_CACHE = PodFolder(
    "inductor_cache_dir",
    "inductor-cache",
    "TORCHINDUCTOR_CACHE_DIR of the warmup and the server (compiled models' artifacts "
    "are restored there)",
    server_env="TORCHINDUCTOR_CACHE_DIR",
)


class Inductor(KeyedFolders):
    name = "inductor"
    order = 40
    folders = (INDUCTOR_CACHE,)
    namespace = remote_models.MODELS
    remade = "to compile in the server"
    nothing_declared = "no models declared"
    bundled = IndexedFiles("inductor/", RECORD_KEY, "models", "compiled model")
    option = BundleOption(
        "--inductor",
        carries="also carry the compiled models stored in this family (<volume>/inductor)",
        goes="the family where compiled models' artifacts go",
    )

    def volume_root(self, volume: Volume) -> Path:
        return volume.inductor

    def declared(self, scope: Scope) -> Sequence[Declared]:
        return scope.models

    def folder(self, scope: Scope, item: Declared) -> Path:
        return scope.folder(INDUCTOR_CACHE.name)


FAMILY = Inductor()
