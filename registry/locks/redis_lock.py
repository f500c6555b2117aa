"""Locks in redis: redis-py's Lock (the release checks the token), renewed by a
heartbeat thread while held, so the TTL only expires for a holder that went silent.

Through outages: every call ends within a deadline well inside the ttl (for the whole
call: a server that trickles its answer is cut there too) and has no retries of its own
(redis-py's would outlast a short lease). A waiter's calls that fail are retried by
``registry.locks``; a renewal that fails is retried here, with backoff, until it
succeeds or the lease has ended by the holder's own clock, which then marks it lost.

A renewal that finds the key gone (a restart that lost it, an eviction) or another
holder's ends the lease at once, and the heartbeat stops: the holder, asking
``Holder.confirm()`` before its write, learns it and does not write. ``confirm`` also
renews once itself, so that a loss between two heartbeats is seen too.

A server restarted empty forgets every key, and a waiter cannot tell that from a lock
nobody held, while the holder learns of it only at its next renewal. So the heartbeat
runs at least every ``RENEW_MAX_S``, and no lock is given on a server up for less than
``RESTART_GRACE_S`` (its uptime, whole seconds): by then a holder from before the restart
has renewed, seen its key gone and stopped its work at its next checkpoint
(``Holder.check``), so the waiter takes the lock after the old holder let go of it (as
Redlock's "delayed restarts", bounded by one renewal rather than the ttl). A failover to
a replica that lacks the key, or a server that spends longer loading its snapshot, is
not caught this way: the store's fence keeps the writes safe there (``registry.locks``).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from registry.core import redis_url
from registry.core.redis_url import cause, redacted
from registry.locks.lease import RETRY_CAP_S, Holder, Lease, LockServerUnreachable, backoff

log = logging.getLogger(__name__)
PREFIX = "triton-warmup:lock:"
POLL_S = 0.05  # a waiter's pause between tries while the lock is held
RENEWALS_PER_TTL = 10  # renewed every ttl/10: a 6 s lease outlives a 4 s outage
RENEW_MAX_S = 0.5  # and at least this often: a restart is seen within one renewal
# No lock on a server up for less (INFO's uptime, whole seconds: over 2 s by the clock); a
# holder from before a restart renews within RENEW_MAX_S and stops at its next checkpoint.
RESTART_GRACE_S = 3
IO_TIMEOUT_CAP_S = 2.0
ETERNAL = -1  # PTTL of a key without an expiry
HOLDER_BYTES = 4096  # a lock key's value (a Holder's JSON) is ~100 bytes; longer: not read
# A lock key's remaining ms and its value (nil unless a string of at most ARGV[1] bytes);
# one without an expiry is deleted in the same step, so a holder's key (always set with
# one) is never touched.
LOOK = """
redis.replicate_commands()
local ttl = redis.call('pttl', KEYS[1])
if ttl == -1 then
  redis.call('del', KEYS[1])
  return {ttl, false}
end
if redis.call('type', KEYS[1]).ok ~= 'string' then
  return {ttl, false}
end
if redis.call('strlen', KEYS[1]) > tonumber(ARGV[1]) then
  return {ttl, false}
end
return {ttl, redis.call('get', KEYS[1])}
"""


def renew_every(ttl: float) -> float:
    """Seconds between a holder's renewals of a lock of ``ttl``."""
    return min(ttl / RENEWALS_PER_TTL, RENEW_MAX_S)


def io_timeout(ttl: float) -> float:
    """Socket connect and read timeout of the calls for a lock of ``ttl``: short enough
    that one hung call leaves the heartbeat time to retry within the lease."""
    return min(ttl / 4, IO_TIMEOUT_CAP_S)


@dataclass
class _Held:
    lock: Any
    holder: Holder
    lease: Lease
    stop: threading.Event
    thread: threading.Thread


class RedisLockBackend:
    """Locks as keys ``triton-warmup:lock:<name>`` on the redis server at ``url``."""

    def __init__(self, url: str, *, password: str | None = None) -> None:
        self.url = url
        self._password = password
        self._clients: dict[float, Any] = {}
        self._unanswered: dict[str, tuple[Holder, float]] = {}  # name -> (SET value, sent at)
        self.restart_grace_s: int = RESTART_GRACE_S  # 0: none (INFO refused, module docstring)
        self._young_logged: set[str] = set()  # the server runs already logged as young
        self.client = self._client(IO_TIMEOUT_CAP_S)
        self._look = self.client.register_script(LOOK)

    def describe(self) -> str:
        return f"redis at {redacted(self.url)}"

    def ping(self) -> None:
        """:class:`LockServerUnreachable` unless the server answers PING."""
        with self._reaching(IO_TIMEOUT_CAP_S):
            self.client.ping()

    def try_acquire(self, name: str, ttl: float, wait: float) -> _Held | None:
        io_s = io_timeout(ttl)
        lock = self._client(io_s).lock(PREFIX + name, timeout=ttl, thread_local=False)
        deadline = time.monotonic() + wait
        self.holder(name)  # a key without an expiry would fail every try: deleted first
        while True:
            sent = time.monotonic()  # a lease runs from the SET that won, not from its reply
            holder = self._value(name)
            text = holder.to_text()
            try:
                with self._reaching(io_s):
                    if self._landed(lock, name, text):
                        sent = self._unanswered[name][1]  # the key's TTL may have started then
                        break
                    if not self._young(lock.redis, name) and lock.acquire(
                        blocking=False, token=text
                    ):
                        break
            except LockServerUnreachable:
                self._unanswered.setdefault(name, (holder, sent))  # it may land all the same
                raise
            if time.monotonic() + POLL_S > deadline:
                return None
            time.sleep(POLL_S)
        self._unanswered.pop(name, None)
        lease = Lease(name, ttl, sent)
        lease.confirm_with(lambda: _confirm(lock, lease))
        holder = replace(holder, lease=lease)
        stop = threading.Event()
        thread = threading.Thread(
            target=_renew, args=(lock, lease, stop), daemon=True, name=f"lock-heartbeat-{name}"
        )
        thread.start()
        return _Held(lock, holder, lease, stop, thread)

    def release(self, handle: object) -> None:
        """Stop the heartbeat and delete the key if it is still this holder's (redis-py
        checks the token). Never raises: the key expires within the ttl anyway."""
        import redis  # redis is optional (the redis extra)

        assert isinstance(handle, _Held)
        handle.stop.set()
        handle.thread.join()
        handle.lease.end()
        lost = handle.lease.lost
        try:
            with redis_url.deadline(io_timeout(handle.lease.ttl)):
                handle.lock.release()
        except redis.exceptions.LockError as e:
            (log.debug if lost else log.warning)(
                "lock %s not ours at release: %s", handle.lease.name, e
            )
        except redis.exceptions.RedisError as e:
            (log.debug if lost else log.warning)(
                "lock %s not released (%s): it expires within %g s",
                handle.lease.name,
                cause(e),
                handle.lease.ttl,
            )

    def holder(self, name: str) -> Holder | None:
        """Who holds ``name``; None for a value that names nobody. A key without an
        expiry is deleted first: every lock this backend sets expires, so such a key was
        put there by hand or by something else, and would block the lock for ever."""
        with self._reaching(IO_TIMEOUT_CAP_S):
            ttl, value = self._look(keys=[PREFIX + name], args=[HOLDER_BYTES])
        if ttl == ETERNAL:
            log.warning(
                "lock %s: deleted a key without an expiry at %s (not a lock this tool sets)",
                name,
                PREFIX + name,
            )
            return None
        return Holder.parse(value)

    def _client(self, timeout: float) -> Any:
        """One client per socket timeout, without redis-py's own retries."""
        if timeout not in self._clients:
            self._clients[timeout] = redis_url.client(
                self.url, timeout_s=timeout, password=self._password, user="The redis lock backend"
            )
        return self._clients[timeout]

    def _young(self, client: Any, name: str) -> bool:
        """Whether the server started less than ``restart_grace_s`` ago (module
        docstring): then no lock is given yet. Asked before each SET, not after it: a
        restart between the two would break the connection that asked. A server that
        refuses INFO (an ACL, a renamed command) turns the grace off, said once."""
        import redis  # redis is optional (the redis extra)

        if self.restart_grace_s <= 0:
            return False
        try:
            info = client.info("server")
        except redis.exceptions.ReadOnlyError:
            raise
        except redis.exceptions.ResponseError as e:
            self.restart_grace_s = 0
            log.warning(
                "lock server %s refuses INFO (%s): locks are given at once after a restart; "
                "the store's fence still keeps a lost holder's writes out",
                redacted(self.url),
                e,
            )
            return False
        up, run = int(info.get("uptime_in_seconds", self.restart_grace_s)), str(info.get("run_id"))
        if up >= self.restart_grace_s:
            return False
        if run not in self._young_logged:
            self._young_logged.add(run)
            log.info(
                "lock %s: the lock server started %d s ago; no lock is given before %d s, so "
                "that a holder from before a restart sees its loss and stops first",
                name,
                up,
                self.restart_grace_s,
            )
        return True

    def _value(self, name: str) -> Holder:
        """This process as the key's value; after a SET whose reply was lost, that SET's
        value again, so that a SET that landed is recognised as ours."""
        if name in self._unanswered:
            return self._unanswered[name][0]
        return Holder.me(secrets.token_hex(8))

    def _landed(self, lock: Any, name: str, text: str) -> bool:
        """Whether an earlier SET of ``text`` landed although its reply was lost: then
        the key is ours, and waiting on it would wait on ourselves for a whole TTL."""
        if name not in self._unanswered:
            return False
        token = lock.redis.get_encoder().encode(text)
        if _value_of(lock) != token:
            return False
        lock.local.token = token  # what redis-py's extend and release check
        return True

    @contextlib.contextmanager
    def _reaching(self, within_s: float) -> Iterator[None]:
        """A call that ends within ``within_s``; any answer but a lock's own (a failover's
        READONLY, a timeout, a refused connection) as :class:`LockServerUnreachable`: a
        waiter retries those."""
        import redis  # redis is optional (the redis extra)

        try:
            with redis_url.deadline(within_s):
                yield
        except redis.exceptions.LockError:
            raise
        except redis.exceptions.RedisError as e:
            raise LockServerUnreachable(redacted(self.url), cause(e)) from e


def _value_of(lock: Any) -> bytes | None:
    """The lock key's value, unless over :data:`HOLDER_BYTES` (then None)."""
    found = redis_url.answer(redis_url.get(lock.redis, lock.name, HOLDER_BYTES))
    return found if isinstance(found, bytes) else None


def _extend(lock: Any, lease: Lease) -> bool:
    """One renewal: True when it went; False, the lease lost, when the key is gone or
    another holder's; redis-py's errors for an outage."""
    import redis  # redis is optional (the redis extra)

    with redis_url.deadline(io_timeout(lease.ttl)):
        try:
            lock.extend(lease.ttl, replace_ttl=True)
            return True
        except redis.exceptions.LockNotOwnedError:
            pass
        why = "its key is gone (the server restarted or evicted it)"
        with contextlib.suppress(redis.exceptions.RedisError):
            held = redis_url.answer(redis_url.get(lock.redis, lock.name, HOLDER_BYTES))
            other = Holder.parse(held) if isinstance(held, bytes) else None
            if other is not None:
                why = f"its key is held by {other.describe()}"
            elif held is not None:
                why = "its key holds another value"
    lease.lose(why)
    return False


def _confirm(lock: Any, lease: Lease) -> None:
    """A renewal now, for a holder about to write: a loss since the last heartbeat is
    seen; an outage leaves the answer to the lease's clock."""
    import redis  # redis is optional (the redis extra)

    sent = time.monotonic()
    try:
        if _extend(lock, lease):
            lease.renewed(sent)
    except redis.exceptions.RedisError as e:
        left = lease.remaining()
        log.debug(
            "lock %s not confirmed (%s): %.1f s of its lease left", lease.name, cause(e), left
        )


def _renew(lock: Any, lease: Lease, stop: threading.Event) -> None:
    """Extend the key every :func:`renew_every`. A failed renewal is retried with
    backoff until one succeeds or the lease ends by this holder's clock; the key gone
    or owned by another token ends it at once, and the heartbeat with it."""
    import redis  # redis is optional (the redis extra)

    every = renew_every(lease.ttl)
    pause, failures = every, 0
    while not stop.wait(pause):
        if lease.lost:
            return
        sent = time.monotonic()
        try:
            if not _extend(lock, lease):
                return
        except redis.exceptions.RedisError as e:
            failures, lease.retries = failures + 1, lease.retries + 1
            if failures == 1:
                log.warning(
                    "lock %s could not be renewed (%s): retrying for %.1f s",
                    lease.name,
                    cause(e),
                    lease.remaining(),
                )
            pause = max(0.0, min(backoff(failures, min(every / 2, RETRY_CAP_S)), lease.remaining()))
            continue
        lease.renewed(sent)
        if failures:
            log.info("lock %s renewed again after %d failed tries", lease.name, failures)
        pause, failures = every, 0
