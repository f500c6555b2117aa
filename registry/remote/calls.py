"""How the remote tier (:mod:`registry.remote.tier`) makes its calls: each within its
deadline, and what a failed one does.

Every call ends within its deadline (``timeout_s``, for the whole call: a server that
trickles its answer is cut there too) and has no retries of its own. A call that fails
logs one warning for the outage, then the tier is skipped (no network) for
``retry_after_s`` and tried again; a call that answers ends the outage. A bad value or
key is warned about once (:class:`WarnOnce`), not on every call that meets it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from registry.core import redis_url
from registry.core.errors import why

log = logging.getLogger("registry.remote.tier")  # the tier's log lines keep their logger's name


@dataclass
class RemoteStats:
    """Counters the metrics read."""

    hits: int = 0
    misses: int = 0
    published: int = 0  # values written (an identical publish writes none)
    errors: int = 0  # calls that failed
    skipped: int = 0  # calls not made while the tier is down
    superseded: int = 0  # fenced publishes refused: another pod stored the entry first
    refused: int = 0  # values not used: unsigned, an unknown key, a signature that fails


class Calls:
    """The deadline of the tier's calls, and its outages: whether it is up, what a failed
    call and one that answers do. ``where``: the tier, for its log lines (no password)."""

    def __init__(
        self, where: str, stats: RemoteStats, *, timeout_s: float, retry_after_s: float
    ) -> None:
        self.where = where
        self.stats = stats
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._retry_at = 0.0  # monotonic: calls are skipped until then
        self._down_since: float | None = None

    @property
    def up(self) -> bool:
        """False while the tier is skipped after a failed call."""
        return time.monotonic() >= self._retry_at

    def ready(self) -> bool:
        """Whether to make a call now; a call not made is counted."""
        if self.up:
            return True
        self.stats.skipped += 1
        return False

    def retry_now(self) -> None:
        """End the skip: the next call is made (``flush``, at the end of a run)."""
        self._retry_at = 0.0

    def failed(self, error: Exception) -> None:
        """A call failed: counted, warned once per outage, then calls skipped for
        ``retry_after_s``."""
        import redis  # redis is optional: a tier without it fails when it is built

        self.stats.errors += 1
        self._retry_at = time.monotonic() + self.retry_after_s
        cause = (
            redis_url.cause(error) if isinstance(error, redis.exceptions.RedisError) else why(error)
        )
        if self._down_since is not None:
            log.debug("registry remote tier %s still unreachable (%s)", self.where, cause)
            return
        self._down_since = time.monotonic()
        log.warning(
            "registry remote tier %s unreachable (%s): using the local tier only; retrying in %g s",
            self.where,
            cause,
            self.retry_after_s,
        )

    def answered(self) -> None:
        """A call answered: the tier is up, and an outage, if there was one, is over."""
        self._retry_at = 0.0  # up: a call made inside the skip (``now``, ``flush``) answered
        if self._down_since is not None:
            down = time.monotonic() - self._down_since
            log.info("registry remote tier %s answers again after %.1f s", self.where, down)
            self._down_since = None

    def deadline(self, seconds: float | None = None) -> contextlib.AbstractContextManager[float]:
        """The deadline of one call: every command it makes, its reconnects included."""
        return redis_url.deadline(self.timeout_s if seconds is None else seconds)


class WarnOnce:
    """The tier's warnings about one key (and field): each said once, not per call."""

    def __init__(self) -> None:
        self._said: set[tuple[str, str]] = set()

    def __call__(self, name: str, field: str, message: str, *args: object) -> None:
        """Warn ``message`` about the slot ``name`` (``field``: "" for the whole key),
        unless this key and field were warned about before."""
        if (name, field) not in self._said:
            self._said.add((name, field))
            where = f"{name} field {field[:12]}" if field else name
            log.warning("remote tier: %s: " + message, where, *args)
