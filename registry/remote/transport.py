"""The remote tier's transport (:mod:`registry.remote.tier`): the redis client and how a call
is made with it, whatever the values it moves.

Every call ends within its deadline (``timeout_s``, plus the time its bytes take at
:data:`MIN_BYTES_PER_S` for one that moves blobs) and has no retries of its own; a call
that fails is an outage (:class:`registry.remote.calls.Calls`: one warning, then the tier
is skipped for ``retry_after_s``). A key that holds another type (someone stored a string
at a slot's name) is a miss, warned once: one bad key is no outage. A call that answers
ends an outage and tells :attr:`Transport.on_answer` (the publish queue drains there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from registry.core import redis_url
from registry.core.errors import RegistryError, shown
from registry.core.redis_url import redacted
from registry.remote.calls import Calls, RemoteStats, WarnOnce

T = TypeVar("T")

# A call moving bytes has them at this rate beyond its deadline: a loaded 2-core node
# moves a blob in chunks at 35-57 MiB/s (bench/remote_blobs.py), so at least 2x that.
MIN_BYTES_PER_S = 16 * 2**20
OTHER_TYPE = "a key of another type"  # what a wrong-typed key is called when no slot is named


class Unanswered(Exception):
    """A call that failed: already counted and warned about as an outage."""


class Transport:
    """The redis client at ``url`` and its calls: each within its deadline, an outage
    skipped until the retry. A test may pass its own ``client`` (a fake redis)."""

    def __init__(
        self,
        url: str,
        stats: RemoteStats,
        warn: WarnOnce,
        *,
        timeout_s: float = 1.0,
        retry_after_s: float = 30.0,
        password: str | None = None,
        client: Any = None,
    ) -> None:
        self.url = url
        self.warn = warn
        self.on_answer: Callable[[], None] = lambda: None  # what follows an answer
        try:
            self.client: Any = (
                redis_url.client(
                    url, timeout_s=timeout_s, password=password, user="The remote tier"
                )
                if client is None
                else client
            )
        except ValueError as e:
            raise RegistryError(
                f"Remote tier URL {shown(redacted(url))} is not valid: {e}"
            ) from None
        self.calls = Calls(  # the deadline of each call, and the outages
            self.describe(), stats, timeout_s=timeout_s, retry_after_s=retry_after_s
        )

    def describe(self) -> str:
        """The server, for log lines (no password)."""
        return f"redis at {redacted(self.url)}"

    def ready(self, now: bool = False) -> bool:
        """Whether to make a call: always ``now``, else unless the tier is skipped (a
        call not made is counted)."""
        return now or self.calls.ready()

    def deadline_for(self, size: int) -> float:
        """The deadline of a call that moves ``size`` bytes."""
        return self.calls.timeout_s + size / MIN_BYTES_PER_S

    def call(
        self, fn: Callable[[Any], T], *, now: bool = False, deadline_s: float | None = None
    ) -> T | None:
        """``fn(client)``'s answer; None when the tier is skipped (unless ``now``), the
        call fails or a key holds another type. Never raises."""
        if not self.ready(now):
            return None
        try:
            return self.attempt(fn, deadline_s=deadline_s)
        except Unanswered:
            return None

    def attempt(
        self,
        fn: Callable[[Any], T],
        *,
        key: str = OTHER_TYPE,
        deadline_s: float | None = None,
        passes: tuple[type[Exception], ...] = (),
        ends_outage: bool = True,
    ) -> T | None:
        """``fn(client)``'s answer, made now, the tier skipped or not; None when ``key``
        holds another type. A failed call raises :class:`Unanswered`; one of ``passes``
        is an answer (the server spoke) and is raised as it is. ``ends_outage=False``:
        an answer does not end the outage (the publish queue's own calls: it ends it
        once all went)."""
        answer = None
        try:
            with self.calls.deadline(deadline_s), self.unless_wrong_type(key):
                answer = fn(self.client)
        except passes:
            if ends_outage:
                self.answered()
            raise
        except Exception as e:
            self.calls.failed(e)
            raise Unanswered(str(e)) from e
        if ends_outage:
            self.answered()
        return answer  # None for a key of another type: warned, a miss

    def answered(self) -> None:
        """A call answered: the outage, if any, is over; :attr:`on_answer` follows."""
        self.calls.answered()
        self.on_answer()

    @contextlib.contextmanager
    def unless_wrong_type(self, key: str) -> Iterator[None]:
        """Redis's WRONGTYPE answer at ``key`` passes, warned once."""
        import redis  # redis is optional: a tier without it fails when it is built

        try:
            yield
        except redis.exceptions.ResponseError as e:
            if not str(e).startswith("WRONGTYPE"):
                raise
            self.warn(key, "", "not a hash, left alone (%s)", e)
