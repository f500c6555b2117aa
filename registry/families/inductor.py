"""Inductor's artifacts of each declared model: what ``torch.compile`` wrote while the
model warmed (FX graph, AOTAutograd and autotune entries, generated code, kernels),
kept on the volume at ``<volume>/inductor`` by model, key and host
(:mod:`registry.inductor_cache`).

A rank restores and saves a model's artifacts around its compile (``warmup.compiled``);
a run that starts no rank (a full hit) restores them here, for the server. The key is
the model's (its code and shapes: ``warmup.compiled.key``); the remote tier shares them
(:mod:`registry.remote_models`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from registry import remote_models
from registry.explain import Differences, fingerprint_differences
from registry.families.base import Declared, Host, Scope, Sources
from registry.families.keyed import KeyedFolders

if TYPE_CHECKING:
    from registry.bundle import Bundle


class Inductor(KeyedFolders):
    name = "inductor"
    order = 40
    remade = "to compile in the server"
    nothing_declared = "no models declared"

    def root(self, scope: Scope) -> Path:
        return scope.volume.inductor

    def declared(self, scope: Scope) -> Sequence[Declared]:
        return scope.models

    def folder(self, scope: Scope, item: Declared) -> Path:
        return scope.inductor_cache_dir

    def bundle_indexes(self, bundle: Bundle) -> Sequence[str]:
        return bundle.indexes

    def differences(
        self, scope: Scope, item: Declared, host: Host, bundled: set[str], sources: Sources
    ) -> Differences | None:
        found = super().differences(scope, item, host, bundled, sources)
        if found is None and sources.remote is not None:
            found = _remote(sources, item, host)
        return found


def _remote(sources: Sources, item: Declared, host: Host) -> Differences | None:
    """How the remote tier's closest index of ``item`` differs (None: it holds none)."""
    assert sources.remote is not None
    fingerprint = host.fingerprint
    stored = remote_models.stored_fingerprints(
        sources.remote, item.name, item.key_digest, fingerprint
    )
    if stored is None:
        return None
    if not stored:
        return {"model code or shapes": (item.key_digest[:12], "other keys")}
    return min((fingerprint_differences(fingerprint.diff(fp)) for fp in stored), key=len)


FAMILY = Inductor()
