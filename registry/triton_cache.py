"""Restore and save Triton's compile cache (TRITON_CACHE_DIR) from and to the volume.

Triton's group files (``<hash>/__grp__<kernel>.json``) list their members by absolute
path, and a lookup misses when any listed path does not exist. A cache copied to
another folder therefore misses everywhere; ``restore`` rewrites every group file to
the folder it now lives in, so the relocated cache hits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from registry import atomic

log = logging.getLogger(__name__)
GROUP_PREFIX = "__grp__"
MAX_GROUP_BYTES = 2**20  # a group file lists a kernel's few files: a few hundred bytes
STALE_TEMP_S = 3600.0
STAGING_PREFIX = ".bundle-"  # bundle.install stages artifacts in such a folder


@dataclass
class CacheSync:
    copied: int = 0  # files written
    present: int = 0  # files already there with the same size
    relocated: int = 0  # group files rewritten to the new folder


def save(cache_dir: Path, target: Path) -> CacheSync:
    """Copy new compile artifacts from ``cache_dir`` into ``target`` (on the volume)."""
    sync = CacheSync()
    remove_stale_temp_files(target)
    for rel, src in cache_files(cache_dir):
        _copy_if_new(src, target / rel, sync)
    log.info(
        "saved triton cache %s -> %s: %d new, %d present",
        cache_dir,
        target,
        sync.copied,
        sync.present,
    )
    return sync


def restore(source: Path, cache_dir: Path) -> CacheSync:
    """Copy the artifacts in ``source`` into ``cache_dir`` and point their groups there."""
    sync = CacheSync()
    for rel, src in cache_files(source):
        _copy_if_new(src, cache_dir / rel, sync)
    sync.relocated = relocate(cache_dir)
    log.info(
        "restored triton cache %s -> %s: %d new, %d present, %d groups relocated",
        source,
        cache_dir,
        sync.copied,
        sync.present,
        sync.relocated,
    )
    return sync


def is_group(name: str) -> bool:
    """Whether a cache file named ``name`` is a group file."""
    return name.startswith(GROUP_PREFIX) and name.endswith(".json")


def relocate(cache_dir: Path, groups: Iterable[Path] | None = None) -> int:
    """Rewrite group files whose member paths are not in their folder; returns how many.

    ``groups``: the group files to look at (default: every one in ``cache_dir``). One
    that is unreadable or over :data:`MAX_GROUP_BYTES` is skipped and logged; a member
    whose path names no file (``/``, ``..``, empty) is dropped, never pointed at a folder.
    """
    count = 0
    found = cache_dir.glob(f"*/{GROUP_PREFIX}*.json") if groups is None else groups
    for group in sorted(found):
        try:
            children = _group_children(group)
        except (OSError, ValueError) as e:
            log.warning("skipping triton group file %s: %s", group, e)
            continue
        moved = {
            name: str(group.parent / Path(path).name)
            for name, path in children.items()
            if Path(path).name not in ("", ".", "..")
        }
        if moved != children:
            atomic.write_bytes(group, json.dumps({"child_paths": moved}).encode())
            count += 1
    return count


def _group_children(group: Path) -> dict[str, str]:
    """A group file's ``{name: path}``; ValueError for anything else (too big, corrupt,
    wrong types), OSError when it cannot be read."""
    data = atomic.loads(atomic.read_bounded(group, MAX_GROUP_BYTES))
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in children.items()
    ):
        raise ValueError("not a group file: no 'child_paths' object of strings")
    return children


def remove_stale_temp_files(folder: Path, older_than_s: float = STALE_TEMP_S) -> int:
    """Remove what killed writers left: ``.tmp-*`` files of a copy and ``.bundle-*``
    staging folders of a bundle install (a live one finishes in seconds or minutes)."""
    if not folder.is_dir():
        return 0
    removed = 0
    cutoff = time.time() - older_than_s
    leftovers = [*folder.glob(f"*/{atomic.TEMP_PREFIX}*"), *folder.glob(f"{STAGING_PREFIX}*")]
    for path in leftovers:
        with contextlib.suppress(OSError):
            st = path.lstat()
            if st.st_mtime < cutoff:
                shutil.rmtree(path) if stat.S_ISDIR(st.st_mode) else path.unlink()
                removed += 1
    return removed


def cache_files(cache_dir: Path) -> Iterator[tuple[Path, Path]]:
    """``(relative path, path)`` of every finished artifact: skips Triton's temp folders
    and lock files, which belong to a compile in progress."""
    if not cache_dir.is_dir():
        return
    for folder in sorted(p for p in cache_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.is_symlink() and _is_artifact(path.name):
                yield path.relative_to(cache_dir), path


def _is_artifact(name: str) -> bool:
    return name != "lock" and not name.startswith((".", "tmp.", atomic.TEMP_PREFIX))


def _copy_if_new(src: Path, dst: Path, sync: CacheSync) -> None:
    # A group file differs only in the folder it names, so any copy of it is current.
    is_group = src.name.startswith(GROUP_PREFIX)
    if dst.exists() and (is_group or dst.stat().st_size == src.stat().st_size):
        sync.present += 1
        return
    atomic.copy_file(src, dst)
    sync.copied += 1
