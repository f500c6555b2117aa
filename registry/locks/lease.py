"""What every lock backend shares: the lease a holder keeps, the holder the caller gets,
the backend protocol, and how a lock's name becomes a file or key name."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from registry.core.entry import now_iso
from registry.core.errors import RegistryError
from registry.core.fingerprint import machine_name

log = logging.getLogger(__name__)
# A lease that ended while its work went on, as each backend says it (name, why).
LOST = (
    "lock %s lost while held (%s): another worker may duplicate this work; "
    "the store keeps whichever result is stored first"
)

DEFAULT_TTL = 60.0
DEFAULT_TIMEOUT = 600.0
WAIT_LOG_INTERVAL = 5.0
RETRY_FIRST_S = 0.05  # the first pause after a failed call; doubling up to a cap
RETRY_CAP_S = 1.0
LEASE_MARGIN = 0.05  # of the ttl: the holder gives up this much before the server would


class LockLost(RegistryError):
    """Work under a lock stopped at a checkpoint because the lock was lost while held:
    another holder may be doing it now. Names the lock and why it was lost."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"lock {name} lost while held ({reason}): work under it stopped")
        self.name = name
        self.reason = reason


class LockServerUnreachable(RegistryError):
    """The lock server did not answer; names where and why."""

    def __init__(self, where: str, cause: str) -> None:
        super().__init__(f"lock server {where} unreachable ({cause})")
        self.where = where
        self.cause = cause


def backoff(attempt: int, cap: float) -> float:
    """Seconds to pause before retry ``attempt`` (1, 2, ...): doubling from
    ``RETRY_FIRST_S`` up to ``cap``, jittered down to half so that retries spread out."""
    doubled = RETRY_FIRST_S * 2.0 ** min(attempt - 1, 30)
    return min(cap, doubled) * random.uniform(0.5, 1.0)


class Lease:
    """A holder's own view of its lock: valid until ``ttl`` (less a margin) after the last
    renewal it sent that succeeded, by its own clock, and lost for good once that passes
    or the server says another holder owns the key."""

    def __init__(self, name: str, ttl: float, sent: float) -> None:
        self.name = name
        self.ttl = ttl
        self.margin = ttl * LEASE_MARGIN
        self.renewals = 0
        self.retries = 0  # renewals that failed and were tried again
        self._valid_until = sent + ttl - self.margin
        self._lost: str | None = None
        self.lost_at: float | None = None  # when the loss was seen (monotonic), once lost
        self._ended = False
        self._mutex = threading.Lock()
        self._confirm: Callable[[], None] | None = None

    @property
    def lost(self) -> bool:
        """Whether this holder may no longer claim the lock (fixed once the block ends)."""
        if self._lost is None and not self._ended and self.remaining() <= 0:
            self.lose(f"not renewed for {self.ttl - self.margin:.1f} s of its {self.ttl:g} s ttl")
        return self._lost is not None

    @property
    def reason(self) -> str | None:
        """Why the lease was lost; None while it holds."""
        return self._lost if self.lost else None

    def confirm_with(self, ask: Callable[[], None]) -> None:
        """The backend's way to ask its server now (a renewal that marks the lease lost
        when the key is gone or another's), for :meth:`confirm`."""
        self._confirm = ask

    def confirm(self) -> bool:
        """Whether this holder still holds the lock, asked of the server now where the
        backend can; a server that does not answer leaves it to this holder's clock."""
        if self._confirm is not None and not self.lost and not self._ended:
            self._confirm()
        return not self.lost

    def remaining(self) -> float:
        """Seconds left by this holder's clock."""
        return self._valid_until - time.monotonic()

    def renewed(self, sent: float) -> None:
        """A renewal sent at ``sent`` (monotonic) succeeded; ignored once lost."""
        with self._mutex:
            if self._lost is None:
                self._valid_until = max(self._valid_until, sent + self.ttl - self.margin)
                self.renewals += 1

    def lose(self, reason: str) -> None:
        with self._mutex:
            first, self._lost = self._lost is None, self._lost or reason
            if first:
                self.lost_at = time.monotonic()
        if first:
            log.warning(LOST, self.name, reason)

    def end(self) -> None:
        """The ``with`` block is over: ``lost`` keeps its last answer."""
        _ = self.lost
        self._ended = True


@dataclass(frozen=True)
class Holder:
    """Who holds a lock and since when; published by the holder for waiters to read.
    The holder's own copy carries its ``lease`` (``lost``)."""

    host: str
    pid: int
    since: str
    token: str
    lease: Lease | None = field(default=None, compare=False, repr=False)

    @classmethod
    def me(cls, token: str, lease: Lease | None = None) -> Holder:
        return cls(machine_name(), os.getpid(), now_iso(), token, lease)

    @property
    def lost(self) -> bool:
        """True once this holder may no longer claim the lock (its backend tracks a lease)."""
        return self.lease is not None and self.lease.lost

    @property
    def loss(self) -> str | None:
        """Why this holder lost the lock, None while it holds it: the heartbeat's and the
        lease clock's view, no call to the server, so cheap enough for every checkpoint
        of the work under the lock."""
        return None if self.lease is None else self.lease.reason

    def check(self) -> None:
        """At a checkpoint of the work under the lock: :class:`LockLost` once it is lost."""
        why = self.loss
        if why is not None:
            assert self.lease is not None
            raise LockLost(self.lease.name, why)

    def confirm(self) -> str | None:
        """Before a write only one holder may make: None while this holder holds the
        lock (asked of the server now where the backend can: :meth:`Lease.confirm`),
        else why it lost it."""
        if self.lease is None or self.lease.confirm():
            return None
        return self.lease.reason or "lost"

    def to_text(self) -> str:
        fields = {"host": self.host, "pid": self.pid, "since": self.since, "token": self.token}
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def parse(cls, text: str | bytes | None) -> Holder | None:
        try:
            data = json.loads(text or "")
            return cls(str(data["host"]), int(data["pid"]), str(data["since"]), str(data["token"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"host {self.host} pid {self.pid} since {self.since}"


class Held(Protocol):
    """What a backend hands back for a lock it acquired: this process as its holder."""

    @property
    def holder(self) -> Holder: ...


class LockBackend(Protocol):
    """A place where locks live: a shared folder or a redis server."""

    def try_acquire(self, name: str, ttl: float, wait: float) -> Held | None:
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
