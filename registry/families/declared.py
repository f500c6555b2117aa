"""Declared folders: a cache folder the manifest names (``caches:``), such as an
inference engine's own cache root (vLLM's ``VLLM_CACHE_ROOT``, SGLang's
``SGLANG_CACHE_DIR``), kept on the volume at ``<volume>/caches`` by name, declared key
and host.

    caches:
      - name: vllm
        path: /root/.cache/vllm
        key: "Qwen/Qwen3-8B rev 0a1b tp2 vllm 0.11"

The key is what the folder's files depend on besides the host (the model and its
revision, the engine's version, its parallelism); the host is the run's fingerprint
(torch, Triton, GPU, CUDA, driver). A folder is restored before the server starts, for
the same key and an equal fingerprint only, and saved when the run ends and, after
ready, by the sidecar's harvest. Paths never enter the key: restored under another
path, the same files are restored.

An engine keys its own cache on more than its files: its environment, the model's
path, its cache root's path (:mod:`registry.families.engine_key`). Each save records
those facts in the index's key (``engine_key``); a restore and ``explain`` compare them
with this pod's, and say when a folder restored whole will still miss in its engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from registry.caches import inductor_cache
from registry.core.errors import RegistryError
from registry.core.explain import Differences
from registry.core.fingerprint import Fingerprint
from registry.core.volume import Volume
from registry.families import engine_key
from registry.families.base import BundleOption, Declared, Scope
from registry.families.bundle_indexed import IndexedFiles
from registry.families.keyed import KeyedFolders

FOLDER = "caches"  # under the volume's root


class DeclaredFolders(KeyedFolders):
    name = "declared-folders"
    order = 50
    namespace = FOLDER  # triton-warmup:caches:<name>:<fingerprint>:<key> on the remote tier
    remade = "to be written again by the server"
    nothing_declared = "no caches declared"
    thing = "declared folder"
    bundled = IndexedFiles(
        f"{FOLDER}/", "caches_indexes", "caches", "declared folder", per_name=True
    )
    option = BundleOption(
        "--caches",
        carries="also carry the declared folders stored in this family (<volume>/caches)",
        goes="the declared folders' family where their artifacts go",
    )

    def volume_root(self, volume: Volume) -> Path:
        return volume.root / FOLDER

    def declared(self, scope: Scope) -> Sequence[Declared]:
        return scope.folders

    def host(self, scope: Scope) -> Fingerprint:
        """The host's fingerprint without a kernel's hash: a folder is no kernel's."""
        return super().host(scope).with_kernel("")

    def folder(self, scope: Scope, item: Declared) -> Path:
        assert item.folder is not None, "a declared folder has its path"
        return item.folder

    def will_miss(
        self, scope: Scope, item: Declared, fingerprint: Fingerprint
    ) -> tuple[Differences, str]:
        """The engine-key facts this pod has (``item``'s key, made by the scope) against
        those the volume's copy was written under; unknown on either side compares equal."""
        here = engine_key.EngineKey.from_json(item.key.get(engine_key.RECORD))
        if here is None:
            return {}, ""
        path = inductor_cache.index_path(self.root(scope), item.name, item.key_digest, fingerprint)
        try:
            stored = inductor_cache.read_index(path).get("key", {})
        except (OSError, RegistryError):
            return {}, ""  # none, or unreadable: the restore says so itself
        there = stored.get(engine_key.RECORD) if isinstance(stored, dict) else None
        found = engine_key.differences(here, engine_key.EngineKey.from_json(there))
        if not found:
            return {}, ""
        why = f"the engine will miss: {engine_key.describe(found)}; {engine_key.FIX}"
        return engine_key.as_factors(found), why


FAMILY = DeclaredFolders()
