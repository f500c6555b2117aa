"""Locks in redis: redis-py's Lock (the release checks the token), renewed by a
heartbeat thread while held, so the TTL only expires for a holder that went silent."""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from registry.errors import RegistryError
from registry.locks import Holder

log = logging.getLogger(__name__)
PREFIX = "triton-warmup:lock:"


@dataclass
class _Held:
    lock: Any
    stop: threading.Event
    thread: threading.Thread


class RedisLockBackend:
    def __init__(self, url: str) -> None:
        try:
            import redis
        except ImportError:
            raise RegistryError(
                "The redis lock backend needs redis-py: pip install 'triton-warmup[redis]'."
            ) from None
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=10)

    def describe(self) -> str:
        return f"redis at {self.url}"

    def try_acquire(self, name: str, ttl: float, wait: float) -> _Held | None:
        lock = self.client.lock(PREFIX + name, timeout=ttl, sleep=0.05, thread_local=False)
        token = Holder.me(secrets.token_hex(8)).to_text()
        if not lock.acquire(blocking=wait > 0, blocking_timeout=wait or None, token=token):
            return None
        stop = threading.Event()
        thread = threading.Thread(
            target=_renew, args=(lock, ttl, stop, name), daemon=True, name=f"lock-heartbeat-{name}"
        )
        thread.start()
        return _Held(lock, stop, thread)

    def release(self, handle: object) -> None:
        import redis

        assert isinstance(handle, _Held)
        handle.stop.set()
        handle.thread.join()
        try:
            handle.lock.release()
        except redis.exceptions.LockError as e:
            log.warning("lock %s had expired before release: %s", handle.lock.name, e)

    def holder(self, name: str) -> Holder | None:
        return Holder.parse(self.client.get(PREFIX + name))


def _renew(lock: Any, ttl: float, stop: threading.Event, name: str) -> None:
    import redis

    while not stop.wait(ttl / 3):
        try:
            lock.extend(ttl, replace_ttl=True)
        except redis.exceptions.RedisError as e:
            log.warning(
                "lock %s could not be renewed (%s): another worker may duplicate this work", name, e
            )
            return
