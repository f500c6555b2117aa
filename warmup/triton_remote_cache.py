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

Trust: a file's name points at its bytes by sha256, and that pointer is signed by the
publishing pod's key (``registry.trust.remote_signature``); a pointer no trusted key
(``TRITON_WARMUP_TRUSTED_KEYS``) signed is refused and Triton compiles, so a writer to
the redis server without a key cannot hand a pod a kernel. Without trusted keys every
pointer is refused (nothing can vouch for it) unless ``TRITON_WARMUP_ALLOW_UNSIGNED=true``
says to take unsigned kernels. Host code (Triton's ``.so`` launcher stubs) is never shared: each
process builds its own.

Redis down or slow: each call waits at most ``TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S``
(0.2 s) for the whole call (a server that trickles its answer included; a blob's call
also has the time its bytes take), then the tier is skipped for 30 s and Triton
compiles locally. Values are read only within their limits (``registry.remote.triton``).
Nothing here raises into Triton.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from triton.runtime.cache import FileCacheManager, RemoteCacheBackend

from registry.caches.triton_cache import GROUP_PREFIX
from registry.remote import triton as remote_triton
from registry.remote.tier import RemoteTier
from warmup.core.settings import Settings

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class RemoteCacheStats:
    """This process's remote lookups and publishes (every manager's), for the metrics.
    Inductor compiles kernels in worker processes, which keep counts of their own."""

    hits: int = 0  # lookups (a file, or a kernel's group and its files) answered whole
    misses: int = 0  # lookups not answered (absent, damaged, incomplete, the tier down)
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
    from warmup.core.services import Services  # Triton loads the plug-in: not the settings

    try:  # an entry point Triton calls: this process's services, built once here
        settings = Settings()
        return Services(settings, remote_timeout_s=settings.remote.triton_timeout_s).remote
    except Exception as e:
        log.warning("remote triton cache off: %s", e)
        return None


def _never_raises(default: Any) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Run the decorated remote step so that nothing it meets reaches Triton: a bug or
    a value no check foresaw is logged once and read as ``default`` (a miss)."""

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def safe(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if fn.__name__ not in _warned:
                    _warned.add(fn.__name__)
                    log.warning("remote triton cache: %s failed, a miss: %r", fn.__name__, e)
                return default  # type: ignore[no-any-return]

        return safe

    return wrap


_warned: set[str] = set()


class RemoteBackend(RemoteCacheBackend):  # type: ignore[misc]
    """Triton's remote cache plug-in: the files of one cache folder (``key``) on the
    registry's remote tier. Never raises: a failure is a miss."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.tier = process_tier()
        self.published: set[str] = set()  # names this instance handed to the tier

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        """The files the tier holds whole (one lookup, counted)."""
        found = self.fetch(filenames)
        whole = bool(found) and all(isinstance(n, str) and n in found for n in filenames)
        _count(**({"hits": 1} if whole else {"misses": 1}))
        return found

    @_never_raises({})
    def fetch(self, filenames: list[str]) -> dict[str, bytes]:
        """The files the tier holds whole, uncounted."""
        if self.tier is None or not isinstance(filenames, (list, tuple, dict)):
            return {}
        return remote_triton.fetch(self.tier, self.key, list(filenames))

    @_never_raises(None)
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
        return self._remote_file(filename)

    @_never_raises(None)
    def _remote_file(self, filename: str) -> str | None:
        assert self.remote is not None
        found = self.remote.fetch([filename])
        _count(**({"hits": 1} if filename in found else {"misses": 1}))
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
        found = self._remote_group(filename)
        _count(**({"hits": 1} if found is not None else {"misses": 1}))
        return found

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path: str = super().put_group(filename, group)
        if self.remote is not None and set(group) <= self.remote.published:
            self.remote.put(f"{GROUP_PREFIX}{filename}", remote_triton.group_value(group))
        return path

    @_never_raises(None)
    def _remote_group(self, filename: str) -> dict[str, str] | None:
        """The group ``filename`` from the tier, written into the local cache whole, or
        None. The tier holds names only (a path from another pod means nothing here); the
        group must name ``filename`` itself (the kernel's metadata)."""
        assert self.remote is not None
        name = f"{GROUP_PREFIX}{filename}"
        raw = self.remote.fetch([name]).get(name)
        names = None if raw is None else remote_triton.group_names(raw, self.key, filename)
        if names is None:
            return None
        found = self.remote.fetch(names)
        if len(found) != len(set(names)):
            return None  # a file evicted or damaged: compile, as for any miss
        paths = {n: self._materialize(n, data) for n, data in found.items()}
        super().put_group(filename, paths)
        return paths

    def _materialize(self, filename: str, data: bytes) -> str:
        """Write a fetched file into the local cache (atomically, as Triton writes)."""
        path: str = super().put(data, filename, binary=True)
        return path
