"""``registry.lock(name, ttl=..., timeout=...)``: one tuner per key across processes, pods, nodes.

A lock alone cannot stop a holder that lost it (paused, partitioned, its redis server
restarted empty) from working on while its successor works: such a holder learns of the
loss late or never. So the store fences the writes a lock is for (``Store.fence``, then
``Store.put(entry, fence=...)``): of the holders of one shape, old and new, only the
first put lands; the others' are refused (``Superseded``) and they use the stored entry.
That needs nothing of the lock server's memory, so it holds for redis and file leases
alike, and for a tuner that went on without the lock. A lost lock still costs the
duplicated work, never a second write.

A lock server that stops answering is waited out: waiters retry until their timeout, a
holder's heartbeat retries until its lease ends by its own clock, and then the holder
says it lost the lock (``Holder.lost``) rather than claim it on. A lock server that
answers that the key is gone or another's ends the lease at once. A holder about to do
what only one holder should (the tuner's write) asks ``Holder.confirm()`` first, which
also asks the server where the backend can, and does not do it once the lease is lost.
Work under the lock checks ``Holder.check()`` (or ``Holder.loss``, no call) at its
checkpoints and stops there once the lease is lost (:class:`LockLost`), so that it does
not go on beside the next holder; after a redis restart the waiter's grace
(``registry.locks.redis_lock``) lets it stop first.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from registry.core.errors import LockTimeout, RegistryError
from registry.core.redis_url import is_redis
from registry.locks.file_lease import FileLeaseBackend
from registry.locks.lease import (
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    LOST,
    RETRY_CAP_S,
    WAIT_LOG_INTERVAL,
    Held,
    Holder,
    Lease,
    LockBackend,
    LockLost,
    LockServerUnreachable,
    backoff,
    lock_file_name,
)
from registry.locks.redis_lock import RedisLockBackend

log = logging.getLogger(__name__)


def default_backend() -> LockBackend:
    """A file backend in the machine's temp folder: one host only; pass a shared folder
    (or a redis URL) for a fleet."""
    return backend_from_url(str(Path(tempfile.gettempdir()) / "triton-warmup-locks"))


def backend_from_url(url: str, *, password: str | None = None) -> LockBackend:
    """``redis://host:port/db``, ``rediss://...``, ``unix:///path.sock``: redis (with
    ``password`` where the URL has none); ``file:///path`` or a plain path: a lease
    folder on a shared volume."""
    if is_redis(url):
        return RedisLockBackend(url, password=password)

    return FileLeaseBackend(Path(url.removeprefix("file://")))


def check_backend(backend: LockBackend) -> None:
    """:class:`LockServerUnreachable` when ``backend`` is a lock server that does not
    answer now (a lease folder is not checked here)."""
    ping = getattr(backend, "ping", None)
    if ping is not None:
        ping()


@contextlib.contextmanager
def lock(
    name: str,
    *,
    ttl: float = DEFAULT_TTL,
    timeout: float = DEFAULT_TIMEOUT,
    backend: LockBackend | None = None,
    outage_s: float | None = None,
) -> Iterator[Holder]:
    """Hold the lock ``name`` for the ``with`` block.

    ``ttl``: seconds after which a silent holder (killed, frozen) may be superseded; a
    live holder renews it by heartbeat. ``timeout``: how long to wait before raising
    :class:`LockTimeout`, which names the holder. Waiters log the holder every few seconds.
    A lock server that does not answer is retried until ``timeout``; if it never
    answered, :class:`LockServerUnreachable` says so. ``outage_s``: raise it sooner, once
    the server has not answered this process for that many seconds in a row
    (:func:`silent_for`, earlier calls included). Yields this holder:
    check ``holder.lost`` before work that only one holder should do.
    """
    if ttl <= 0 or timeout < 0 or (outage_s is not None and outage_s < 0):
        raise RegistryError(
            f"Lock '{name}': ttl {ttl!r} must be > 0, timeout {timeout!r} and "
            f"outage_s {outage_s!r} >= 0."
        )
    backend = backend or default_backend()
    handle = _wait_for(backend, name, ttl, timeout, math.inf if outage_s is None else outage_s)
    try:
        yield handle.holder
    finally:
        backend.release(handle)


def _wait_for(backend: LockBackend, name: str, ttl: float, timeout: float, outage_s: float) -> Held:
    start = time.monotonic()
    deadline = start + timeout
    outage = _Outage(name, backend.describe())
    while True:
        wait = max(0.0, min(WAIT_LOG_INTERVAL, deadline - time.monotonic()))
        try:
            handle = backend.try_acquire(name, ttl, wait)
            holder = backend.holder(name) if handle is None else None
        except LockServerUnreachable as e:
            outage.failed(e, start)
            if _silent_s(outage.where) >= outage_s:
                raise e from None
            if time.monotonic() >= deadline:
                raise outage.give_up(timeout) from None
            left = deadline - time.monotonic()
            time.sleep(max(0.0, min(backoff(outage.failures, RETRY_CAP_S), left)))
            continue
        outage.over()
        if handle is not None:
            waited = time.monotonic() - start
            if waited > 1.0:
                log.info("lock %s acquired after %.1f s", name, waited)
            return handle
        who = holder.describe() if holder else "an unknown holder"
        if time.monotonic() >= deadline:
            raise LockTimeout(name, timeout, f"{who} ({backend.describe()})")
        log.info(
            "waiting for lock %s: held by %s (%.0f s waited)", name, who, time.monotonic() - start
        )


# Per lock server (``LockBackend.describe()``), shared by every waiter of this process:
_OUTAGE_LOGGED: dict[str, float] = {}  # when a waiter last logged it down (monotonic)
_SILENT_SINCE: dict[str, float] = {}  # the first failed call since it last answered


def silent_for(backend: LockBackend | None) -> float:
    """Seconds the lock server has not answered this process, in a row, whichever lock
    was asked (0 while it answers)."""
    return _silent_s((backend or default_backend()).describe())


def _silent_s(where: str) -> float:
    since = _SILENT_SINCE.get(where)
    return 0.0 if since is None else time.monotonic() - since


class _Outage:
    """A waiter's view of its lock server: failed calls in a row, and whether the server
    ever answered. The silence is timed per server (:func:`silent_for`), and logged every
    ``WAIT_LOG_INTERVAL`` at most per server, by all waiters together (a run that tries
    many locks while the server is down)."""

    def __init__(self, name: str, where: str) -> None:
        self.name, self.where = name, where
        self.failures = 0
        self.answered = False
        self.error: LockServerUnreachable | None = None

    def failed(self, error: LockServerUnreachable, start: float) -> None:
        self.failures, self.error = self.failures + 1, error
        now = time.monotonic()
        _SILENT_SINCE.setdefault(self.where, now)
        if now - _OUTAGE_LOGGED.get(self.where, -math.inf) >= WAIT_LOG_INTERVAL:
            _OUTAGE_LOGGED[self.where] = now
            log.warning(
                "waiting for lock %s: %s; retrying (%d tries, %.0f s waited)",
                self.name,
                error,
                self.failures,
                now - start,
            )

    def over(self) -> None:
        if self.failures:
            log.info("lock %s: the lock server answers again", self.name)
        _OUTAGE_LOGGED.pop(self.where, None)
        _SILENT_SINCE.pop(self.where, None)
        self.failures, self.answered = 0, True

    def give_up(self, timeout: float) -> RegistryError:
        assert self.error is not None
        if not self.answered:
            return self.error
        return LockTimeout(self.name, timeout, f"an unknown holder ({self.error})")


__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "LOST",
    "Held",
    "Holder",
    "Lease",
    "LockBackend",
    "LockLost",
    "LockServerUnreachable",
    "backend_from_url",
    "check_backend",
    "default_backend",
    "lock",
    "lock_file_name",
    "silent_for",
]
