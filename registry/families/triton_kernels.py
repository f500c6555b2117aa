"""Triton's compiled kernels: the files of ``TRITON_CACHE_DIR`` (cubins, their metadata
and group files, launcher stubs), kept on the volume at ``<volume>/triton-cache``.

Restored into this pod's TRITON_CACHE_DIR before anything compiles (group files pointed
at their new folder), saved back at the run's end with the host's origin recorded for
``explain`` (:mod:`registry.caches.triton_cache`). Triton's own hash names each folder, so the
key needs nothing of ours and no path enters it.

After ready, the sidecar harvests a kernel when its group file appears (Triton writes it
last, by rename), with every file the group names, and a launcher stub
(``<hash>/<name>.so``, host code: to the volume only). Each is checked before anything
is written: inside a folder of the cache, regular files, under the caps, and compiled
for this host (the origin its metadata names). The helpers below are shared with
:mod:`registry.families.triton_autotune`, whose results live in the same folders.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from registry.caches import triton_cache
from registry.caches.triton_cache import (
    GROUP_PREFIX,
    MAX_GROUP_BYTES,
    Kind,
    Origin,
    is_group,
    relocate,
)
from registry.core import atomic
from registry.core.errors import BundleRejected, shown
from registry.core.explain import Prediction, predict
from registry.core.patterns import TRITON_CACHE_KEY
from registry.core.volume import Volume
from registry.families.base import BundleOption, Family, Host, Moved, PodFolder, Scope, Sources
from registry.families.bundle_parts import BundlePart, Packed, PartReader
from registry.families.file_harvest import (
    FileLimits,
    Harvested,
    Refused,
    Upload,
    opened,
    read_at,
    temporary,
)
from registry.families.staging import Stage
from registry.remote import triton as remote_triton

if TYPE_CHECKING:
    from registry.bundles.bundle import Limits
    from registry.remote.tier import RemoteTier

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
    file_kinds = MappingProxyType({"kernel": "triton-kernels", "stub": "triton-stubs"})

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

    def file_folders(self, scope: Scope) -> list[Path]:
        return [scope.folder(TRITON_CACHE.name)]

    def file_kind(self, scope: Scope, path: Path) -> str | None:
        """A kernel when its group file appears; a launcher stub renamed into place."""
        if not in_a_cache_folder(scope, path):
            return None
        if is_group(path.name):
            return "kernel"
        if path.name.endswith(".so") and not temporary(path.name):
            return "stub"
        return None

    def harvest_file(self, scope: Scope, kind: str, path: Path, limits: FileLimits) -> Harvested:
        if kind == "kernel":
            return _kernel(scope, path, limits)
        if kind == "stub":
            return _stub(scope, path, limits)
        return super().harvest_file(scope, kind, path, limits)


def _kernel(scope: Scope, group_path: Path, limits: FileLimits) -> Harvested:
    """A kernel's group and every file it names, read once and checked, to the volume
    (groups last) with its origin recorded; all of them shared."""
    folder, group = group_path.parent, group_path.name
    check_folder(scope, folder)
    with opened(folder) as at:  # every read below is in this folder, never a link
        group_bytes = read_at(at, group, MAX_GROUP_BYTES)
        files: dict[str, bytes] = {}
        left = limits.max_entry_bytes
        for name in _group_names(folder, group_bytes):
            files[name] = read_at(at, name, min(limits.max_file_bytes, left))
            left -= len(files[name])
    meta_name = group.removeprefix(GROUP_PREFIX)
    if meta_name not in files:
        raise Refused("its group does not name its metadata file")
    try:
        factors = triton_cache.metadata_factors(files[meta_name])
    except ValueError as e:
        raise Refused(f"unreadable metadata: {e}") from None
    origin = origin_of(scope)
    foreign = triton_cache.compare(origin, factors)
    if foreign:
        factor, (mine, theirs) = next(iter(foreign.items()))
        raise Refused(f"compiled for {factor} {theirs}; this pod has {mine}")
    new = write_new(scope.volume.triton_cache / folder.name, {**files, group: group_bytes})
    record(scope, origin, folder.name)
    shared = {**files, group: remote_triton.group_value(files)}
    return Harvested(result(new), sum(map(len, files.values())), uploads(folder.name, shared))


def _stub(scope: Scope, path: Path, limits: FileLimits) -> Harvested:
    """A launcher stub Triton built for a kernel's signature (host code: to the volume
    only, which the pod trusts as it trusts its own saves; never to the remote tier).
    A new signature costs a build of ~0.4 s otherwise."""
    folder = path.parent
    check_folder(scope, folder)
    with opened(folder) as at:
        data = read_at(at, path.name, limits.max_file_bytes)
    if not data.startswith(b"\x7fELF"):
        raise Refused("not a shared object")
    new = write_new(scope.volume.triton_cache / folder.name, {path.name: data})
    return Harvested(result(new), len(data))


def _group_names(folder: Path, raw: bytes) -> list[str]:
    try:
        children = triton_cache.parse_group(raw)
    except ValueError as e:
        raise Refused(f"unreadable group: {e}") from None
    names = []
    for name, child in children.items():
        if Path(child).parent != folder or Path(child).name != name:
            raise Refused(f"its group names {child!r}, outside its folder")
        if not remote_triton.valid(folder.name, name) or is_group(name):
            raise Refused(f"its group names {name!r}")
        names.append(name)
    if not names:
        raise Refused("its group names no file")
    return sorted(names)


def in_a_cache_folder(scope: Scope, path: Path) -> bool:
    """Whether ``path`` is a file of a folder of this pod's Triton cache."""
    return path.parent.parent == scope.folder(TRITON_CACHE.name)


def check_folder(scope: Scope, folder: Path) -> None:
    """Refused unless ``folder`` is a folder of this pod's Triton cache, by its name."""
    cache = scope.folder(TRITON_CACHE.name)
    if folder.parent != cache or not TRITON_CACHE_KEY.fullmatch(folder.name):
        raise Refused("not a folder of the Triton cache")


def origin_of(scope: Scope) -> Origin:
    """What this host compiles: the harvest knows it (it waits for the pod's host)."""
    if scope.fingerprint is None:
        raise Refused("this host is not known yet")
    return Origin.of(scope.fingerprint, scope.triton_env or {})


def write_new(target: Path, files: dict[str, bytes]) -> bool:
    """Write the files the volume lacks (groups last); whether any was written."""
    new = False
    for name in sorted(files, key=is_group):
        dst = target / name
        if dst.is_file() and dst.stat().st_size == len(files[name]):
            continue
        atomic.write_bytes(dst, files[name])
        new = True
    return new


def record(scope: Scope, origin: Origin, folder: str) -> None:
    """The kernel's origin, in the harvests' record (``explain`` reads it): one for
    every harvesting sidecar, so a race loses a folder's record at worst."""
    triton_cache.record_origin(scope.volume.triton_cache, origin, [folder], writer="harvest")


def result(new: bool) -> str:
    return "harvested" if new else "deduplicated"


def uploads(cache_key: str, files: dict[str, bytes]) -> tuple[Upload, ...]:
    """Every file to the remote tier under its cache folder's key, the group last."""
    ordered = sorted(files.items(), key=lambda item: is_group(item[0]))
    return tuple(Upload(cache_key, name, data, _send) for name, data in ordered)


def _send(remote: RemoteTier, upload: Upload) -> bool:
    return remote_triton.publish(remote, upload.key, upload.name, upload.data)


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
