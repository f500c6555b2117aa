"""``registry.lock(name, ttl=..., timeout=...)``: one tuner per key across processes, pods, nodes.

Locks are efficiency locks: a holder that lost its lease (killed, paused, partitioned)
may overlap its successor, so whatever a lock protects must tolerate a duplicate.
Every registry write is an idempotent merge for that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from registry.entry import now_iso
from registry.errors import LockTimeout, RegistryError
from registry.fingerprint import machine_name

log = logging.getLogger(__name__)

DEFAULT_TTL = 60.0
DEFAULT_TIMEOUT = 600.0
WAIT_LOG_INTERVAL = 5.0


@dataclass(frozen=True)
class Holder:
    """Who holds a lock and since when; published by the holder for waiters to read."""

    host: str
    pid: int
    since: str
    token: str

    @classmethod
    def me(cls, token: str) -> Holder:
        return cls(host=machine_name(), pid=os.getpid(), since=now_iso(), token=token)

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str | bytes | None) -> Holder | None:
        try:
            data = json.loads(text or "")
            return cls(str(data["host"]), int(data["pid"]), str(data["since"]), str(data["token"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"host {self.host} pid {self.pid} since {self.since}"


class LockBackend(Protocol):
    """A place where locks live: a shared folder or a redis server."""

    def try_acquire(self, name: str, ttl: float, wait: float) -> object | None:
        """Wait up to ``wait`` seconds; a handle when acquired, else None."""

    def release(self, handle: object) -> None: ...

    def holder(self, name: str) -> Holder | None: ...

    def describe(self) -> str: ...


def lock_file_name(name: str) -> str:
    """A filesystem-safe, readable, collision-free name for the lock ``name``."""
    if not name or not isinstance(name, str):
        raise RegistryError(f"Lock name {name!r} is empty or not a string.")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80]
    return f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def default_backend() -> LockBackend:
    """A file backend in the machine's temp folder: one host only; pass a shared folder
    (or a redis URL) for a fleet."""
    return backend_from_url(str(Path(tempfile.gettempdir()) / "triton-warmup-locks"))


def backend_from_url(url: str) -> LockBackend:
    """``redis://host:port/db``, ``rediss://...``, ``unix:///path.sock``: redis;
    ``file:///path`` or a plain path: a lease folder on a shared volume."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from registry.locks.redis_lock import RedisLockBackend

        return RedisLockBackend(url)
    from registry.locks.file_lease import FileLeaseBackend

    return FileLeaseBackend(Path(url.removeprefix("file://")))


@contextlib.contextmanager
def lock(
    name: str,
    *,
    ttl: float = DEFAULT_TTL,
    timeout: float = DEFAULT_TIMEOUT,
    backend: LockBackend | None = None,
) -> Iterator[Holder | None]:
    """Hold the lock ``name`` for the ``with`` block.

    ``ttl``: seconds after which a silent holder (killed, frozen) may be superseded; a
    live holder renews it by heartbeat. ``timeout``: how long to wait before raising
    :class:`LockTimeout`, which names the holder. Waiters log the holder every few seconds.
    """
    if ttl <= 0 or timeout < 0:
        raise RegistryError(f"Lock '{name}': ttl {ttl!r} must be > 0 and timeout {timeout!r} >= 0.")
    backend = backend or default_backend()
    handle = _wait_for(backend, name, ttl, timeout)
    try:
        yield backend.holder(name)
    finally:
        backend.release(handle)


def _wait_for(backend: LockBackend, name: str, ttl: float, timeout: float) -> object:
    start = time.monotonic()
    deadline = start + timeout
    while True:
        wait = max(0.0, min(WAIT_LOG_INTERVAL, deadline - time.monotonic()))
        handle = backend.try_acquire(name, ttl, wait)
        if handle is not None:
            waited = time.monotonic() - start
            if waited > 1.0:
                log.info("lock %s acquired after %.1f s", name, waited)
            return handle
        holder = backend.holder(name)
        who = holder.describe() if holder else "an unknown holder"
        if time.monotonic() >= deadline:
            raise LockTimeout(name, timeout, f"{who} ({backend.describe()})")
        log.info(
            "waiting for lock %s: held by %s (%.0f s waited)", name, who, time.monotonic() - start
        )


__all__ = ["Holder", "LockBackend", "backend_from_url", "default_backend", "lock"]
