"""Triton's cache plug-ins over the registry's remote tier: a process whose local
``TRITON_CACHE_DIR`` misses loads the kernel another pod compiled, before compiling.

Turn it on in the serving process (and the init container) with::

    TRITON_CACHE_MANAGER=warmup.triton_remote_cache:TieredCacheManager
    TRITON_WARMUP_REMOTE_URL=redis://redis:6379/0      # or the lock server's redis

:class:`TieredCacheManager` is Triton's file cache, local first: a local hit never asks
the network; a miss asks the remote tier, writes what it found into the local cache in
Triton's own format (so restore, save and harvest read it as any other entry) and
returns it; every file Triton writes is published. :class:`RemoteBackend` is the same
tier as Triton's remote cache plug-in (``TRITON_REMOTE_CACHE_BACKEND``), for Triton's
``RemoteCacheManager``; that manager asks the network on every lookup, hits or not, and
writes groups that Triton's file cache cannot read back, so the tiered manager is the
one to use.

Redis down or slow: each call waits at most ``TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S``
(0.2 s), then the tier is skipped for 30 s and Triton compiles locally. Nothing here
raises into Triton.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from triton.runtime.cache import FileCacheManager, RemoteCacheBackend

from registry import remote_triton
from registry.remote import RemoteTier, remote_tier
from registry.triton_cache import GROUP_PREFIX, MAX_GROUP_BYTES

log = logging.getLogger(__name__)
RETRY_AFTER_S = 30.0


@dataclass
class RemoteCacheStats:
    """This process's remote lookups and publishes (every manager's), for the metrics."""

    hits: int = 0  # lookups the tier answered with the whole file or group
    misses: int = 0  # lookups it could not answer (absent, damaged, the tier down)
    published: int = 0  # files handed to the tier (new or already there)
    refused: int = 0  # files not published: too big, a bad name, the tier down


stats = RemoteCacheStats()
_stats_lock = threading.Lock()


def _count(**increments: int) -> None:
    with _stats_lock:
        for name, n in increments.items():
            setattr(stats, name, getattr(stats, name) + n)


@functools.cache
def process_tier() -> RemoteTier | None:
    """The remote tier of this process's settings; None when there is none, or the
    settings cannot be read (logged once: Triton then caches locally only)."""
    from warmup.settings import Settings

    try:
        settings = Settings()
        return remote_tier(settings.remote_location, timeout_s=settings.triton_remote_timeout_s)
    except Exception as e:
        log.warning("remote triton cache off: %s", e)
        return None


class RemoteBackend(RemoteCacheBackend):  # type: ignore[misc]
    """Triton's remote cache plug-in: the files of one cache folder (``key``) on the
    registry's remote tier. Never raises: a failure is a miss."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.tier = process_tier()
        self.published: set[str] = set()  # names this instance handed to the tier

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        if self.tier is None:
            return {}
        found = remote_triton.fetch(self.tier, self.key, filenames)
        _count(hits=len(found), misses=len(set(filenames) - set(found)))
        return found

    def put(self, filename: str, data: bytes) -> None:
        if self.tier is None:
            return
        if remote_triton.publish(self.tier, self.key, filename, data):
            self.published.add(filename)
            _count(published=1)
        else:
            _count(refused=1)


class TieredCacheManager(FileCacheManager):  # type: ignore[misc]
    """Triton's file cache, with the remote tier behind it (``TRITON_CACHE_MANAGER``)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        # Dumps and overrides are a person's debugging: they stay on this machine.
        remote = not (override or dump) and process_tier() is not None
        self.remote = RemoteBackend(key) if remote else None

    def get_file(self, filename: str) -> str | None:
        path: str | None = super().get_file(filename)
        if path is not None or self.remote is None:
            return path
        found = self.remote.get([filename])
        return self._materialize(filename, found[filename]) if filename in found else None

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path: str = super().put(data, filename, binary=binary)
        # A group names local paths: put_group publishes its own form, after its files.
        if self.remote is not None and not filename.startswith(GROUP_PREFIX):
            self.remote.put(filename, data if isinstance(data, bytes) else str(data).encode())
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        group: dict[str, str] | None = super().get_group(filename)
        if group is not None or self.remote is None:
            return group
        names = self._remote_group(filename)
        if names is None:
            return None
        found = self.remote.get(names)
        if len(found) != len(names):
            return None  # a file evicted or damaged: compile, as for any miss
        paths = {name: self._materialize(name, data) for name, data in found.items()}
        super().put_group(filename, paths)
        return paths

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path: str = super().put_group(filename, group)
        if self.remote is not None and set(group) <= self.remote.published:
            names = json.dumps({"child_paths": sorted(group)}).encode()
            self.remote.put(f"{GROUP_PREFIX}{filename}", names)
        return path

    def _remote_group(self, filename: str) -> list[str] | None:
        """The file names of the group ``filename`` as the tier holds it (names only:
        a path from another pod means nothing here), or None."""
        assert self.remote is not None
        name = f"{GROUP_PREFIX}{filename}"
        raw = self.remote.get([name]).get(name)
        if raw is None or len(raw) > MAX_GROUP_BYTES:
            return None
        try:
            children = json.loads(raw)["child_paths"]
        except (ValueError, KeyError, TypeError):
            return None
        names = list(children) if isinstance(children, (list, dict)) else []
        if not names or not all(
            isinstance(n, str) and remote_triton.valid(self.key, n) for n in names
        ):
            return None
        return names

    def _materialize(self, filename: str, data: bytes) -> str:
        """Write a fetched file into the local cache (atomically, as Triton writes)."""
        path: str = super().put(data, filename, binary=True)
        return path
