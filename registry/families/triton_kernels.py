"""Triton's compiled kernels: the files of ``TRITON_CACHE_DIR`` (cubins, their metadata
and group files, launcher stubs), kept on the volume at ``<volume>/triton-cache``.

Restored into this pod's TRITON_CACHE_DIR before anything compiles (group files pointed
at their new folder), saved back at the run's end with the host's origin recorded for
``explain`` (:mod:`registry.triton_cache`). Triton's own hash names each folder, so the
key needs nothing of ours and no path enters it.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from registry import remote_triton, triton_cache
from registry.bundle_parts import BundlePart, Packed, PartReader, Stage
from registry.errors import BundleRejected, shown
from registry.explain import Prediction, predict
from registry.families.base import BundleOption, Family, Host, Moved, PodFolder, Scope, Sources
from registry.patterns import TRITON_CACHE_KEY
from registry.triton_cache import Kind, Origin, is_group, relocate
from registry.volume import Volume

if TYPE_CHECKING:
    from registry.bundle import Limits

log = logging.getLogger(__name__)

TRITON_CACHE = PodFolder(
    "triton_cache_dir",
    "triton-cache",
    "TRITON_CACHE_DIR to restore into, and where the server's Triton compiles",
    server_env="TRITON_CACHE_DIR",
)


class CacheFiles(BundlePart):
    """Triton's cache files in a bundle: ``triton-cache/<hash>/<file>``."""

    prefix = "triton-cache/"
    what = "Triton artifacts"
    counted = "artifacts"
    option = "cache"

    def pack(self, root: Path, *, only: str | None = None) -> Packed:
        packed = Packed()
        for rel, path in triton_cache.cache_files(root):
            packed.members[f"{self.prefix}{rel.as_posix()}"] = path
        return packed

    def limit(self, label: str, name: str, limits: Limits) -> tuple[str, int]:
        """A Triton cache folder name and a file that is no dot file; a group file is
        bounded by its own limit (``relocate`` reads each whole, after the swap)."""
        parts = PurePosixPath(name).parts
        if len(parts) != 3:
            raise BundleRejected(label, f"artifact '{name}' is not triton-cache/<hash>/<file>")
        if not TRITON_CACHE_KEY.fullmatch(parts[1]):  # never .bundle-*, "." or ".."
            raise BundleRejected(
                label,
                f"artifact '{name}': {shown(parts[1])} is not a Triton cache folder name "
                f"({TRITON_CACHE_KEY.pattern})",
            )
        if parts[2].startswith("."):  # Triton's temp files and our own start with a dot
            raise BundleRejected(label, f"artifact '{name}' has a file name that starts with a dot")
        if is_group(parts[2]):
            return "Triton group file", min(limits.max_member_bytes, limits.max_group_bytes)
        return "member", limits.max_member_bytes

    def reader(
        self, label: str, limits: Limits, stage: Stage | None, budget: Any = None
    ) -> PartReader:
        return _GroupsRelocated(self, label, limits, stage, budget)


class _GroupsRelocated(PartReader):
    def commit(self) -> None:
        """The files in, then their group files pointed at the folder they now live in."""
        super().commit()
        if self.stage is None:
            return
        moved = self.stage.moved
        groups = [self.stage.cache / rel for rel in moved if is_group(PurePosixPath(rel).name)]
        try:
            relocate(self.stage.cache, groups)
        except OSError as e:  # after the swap: a miss costs a recompile, not the install
            log.error(
                "group files in %s not relocated (Triton compiles again): %s", self.stage.cache, e
            )


class TritonKernels(Family):
    name = "triton-kernels"
    order = 20
    folders = (TRITON_CACHE,)
    bundled = CacheFiles()
    option = BundleOption(
        "--triton-cache",
        carries="also carry these compile artifacts (a TRITON_CACHE_DIR folder)",
        goes="where artifacts go",
        pod=TRITON_CACHE.name,
    )

    def volume_root(self, volume: Volume) -> Path:
        return volume.triton_cache

    def restore(self, scope: Scope) -> Moved:
        done = triton_cache.restore(scope.volume.triton_cache, scope.folder(TRITON_CACHE.name))
        return Moved(self.name, copied=done.copied, present=done.present)

    def save(self, scope: Scope) -> Moved:
        """New files onto the volume; with the host known, its origin recorded."""
        origin = None
        if scope.fingerprint is not None:
            origin = Origin.of(scope.fingerprint, scope.triton_env)
        done = triton_cache.save(scope.folder(TRITON_CACHE.name), scope.volume.triton_cache, origin)
        return Moved(self.name, copied=done.copied, present=done.present)

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        return triton_prediction(self.name, "kernels", scope, host, sources)


def triton_prediction(
    family: str, kind: Kind, scope: Scope, host: Host, sources: Sources
) -> Prediction:
    """Triton's kernels or autotune results: on the volume (``restore`` relocates them),
    in this pod's TRITON_CACHE_DIR (as Triton reads it), on the remote tier (sampled)."""
    volume = scope.volume.triton_cache
    recorded = triton_cache.origins(volume)  # read once: they also name a restored cache's
    held, unknown = triton_cache.held_differences(volume, host.triton, kind, known=recorded)
    if sources.local:
        mine, mine_unknown = triton_cache.held_differences(
            scope.folder(TRITON_CACHE.name), host.triton, kind, restored=False, known=recorded
        )
        held.update(mine)
        unknown = (unknown - set(held)) | mine_unknown
    if sources.remote is not None:
        for cache_key, data in remote_triton.sample_metadata(sources.remote).items():
            try:
                factors = triton_cache.metadata_factors(data)
                held.setdefault(cache_key, triton_cache.compare(host.triton, factors))
            except ValueError:
                unknown.add(cache_key)
    note = f"{len(unknown)} of unknown origin not predicted" if unknown else ""
    return predict(family, held.values(), note=note)


FAMILY = TritonKernels()
