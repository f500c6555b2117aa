"""A redis server's URL, read in one place: which URLs name one, how one is shown in a
message (never its password), the client each user of redis makes from it, and the two
things every such client keeps to: a deadline for each whole call, and values read
only after their length is known to be within a limit.

Deadlines: redis-py's ``socket_timeout`` bounds each ``recv``, so a server that answers
one byte at a time holds a call for ever, while a busy one that is slow to start a long
answer is cut at the first pause. The client made here gives every socket wait
(connect, TLS handshake, send, receive) all that is left of the deadline of the call it
belongs to, and no more: :func:`deadline` for a call of several commands (a pipeline, a
transaction under WATCH, a SCAN loop, a blob moved in chunks), else one ``timeout_s``
for each command. A connection cut mid-answer is closed, never reused.

Bounded reads: :func:`get` and :func:`hget` send a small Lua script that returns the
value only when its length is within the limit, in one atomic step (a value that grows
between a length check and a read would otherwise be read whole). :func:`hgetall`
reads a hash's fields within a per-field limit and a budget for all of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from registry.core.errors import RegistryError

SCHEMES = ("redis://", "rediss://", "unix://")
FIELD_NAME_BYTES = 256  # a hash's field name that we read (a digest); longer ones are skipped
NAMED_OVERSIZED = 8  # of a hash's fields too big to read, this many are named

# The deadline (time.monotonic()) of the redis call this thread is making, if any.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "redis_deadline", default=None
)

# KEYS[1]'s value if at most ARGV[1] bytes: {length, value}; {length} when longer;
# {0, nil} when there is none.
_GET = """
local n = redis.call('strlen', KEYS[1])
if n > tonumber(ARGV[1]) then return {n} end
return {n, redis.call('get', KEYS[1])}
"""
# The same for the field ARGV[1] of the hash KEYS[1], limit ARGV[2].
_HGET = """
local n = redis.call('hstrlen', KEYS[1], ARGV[1])
if n > tonumber(ARGV[2]) then return {n} end
return {n, redis.call('hget', KEYS[1], ARGV[1])}
"""
# The fields of the hash KEYS[1] (names of at most ARGV[4] bytes) whose values are at
# most ARGV[1] bytes, while their sum stays within ARGV[2] and their count within
# ARGV[3]: {{field, value, ...}, {field, length, ...} of up to ARGV[5] left out, the
# number left out}.
_HGETALL = """
local limit, budget, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local name_limit, named = tonumber(ARGV[4]), tonumber(ARGV[5])
local found, over, skipped, total = {}, {}, 0, 0
for _, f in ipairs(redis.call('hkeys', KEYS[1])) do
  local n = redis.call('hstrlen', KEYS[1], f)
  if #f <= name_limit and n <= limit and total + n <= budget and #found < 2 * most then
    found[#found + 1] = f
    found[#found + 1] = redis.call('hget', KEYS[1], f)
    total = total + n
  else
    skipped = skipped + 1
    if #over < 2 * named then
      over[#over + 1] = string.sub(f, 1, name_limit)
      over[#over + 1] = n
    end
  end
end
return {found, over, skipped}
"""


def is_redis(url: str) -> bool:
    """Whether ``url`` names a redis server (else: a lease folder, '' or 'off')."""
    return url.startswith(SCHEMES)


def redacted(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password (``redis://:pw@host``, ``unix://...?password=``)."""
    parts = urlsplit(url)
    return parts.password is not None or "password=" in parts.query


def client(
    url: str, *, timeout_s: float, password: str | None = None, user: str = "A redis client"
) -> Any:
    """A redis-py client for ``url`` whose every call ends within ``timeout_s`` (each
    command, unless a :func:`deadline` of the caller's bounds several together), and is
    never retried by redis-py: the caller decides what a failure means. ``password``:
    used when the URL carries none. :class:`RegistryError` saying that ``user`` needs
    redis-py when it is not installed; ``ValueError`` for a bad URL."""
    try:
        import redis  # noqa: F401  (the message below when it is missing)
        from redis.backoff import NoBackoff  # redis is optional (the redis extra)
        from redis.retry import Retry  # redis is optional (the redis extra)
    except ImportError:
        raise RegistryError(f"{user} needs redis-py: pip install 'triton-warmup[redis]'.") from None

    if not is_redis(url):
        raise ValueError(f"not a redis URL (use {', '.join(SCHEMES)})")
    kinds = _bounded_classes()
    scheme = url.partition("://")[0]
    extra = {} if password is None or has_password(url) else {"password": password}
    made: Any = kinds["client"].from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        connection_class=kinds[scheme],
        **extra,
    )
    made.call_s = timeout_s
    return made


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Every redis call this thread makes inside the block ends ``seconds`` from now at
    the latest (or at an enclosing block's deadline, if earlier): a call still waiting
    then fails with redis-py's ``TimeoutError``. Yields the deadline (monotonic)."""
    outer = _DEADLINE.get()
    at = time.monotonic() + seconds
    token = _DEADLINE.set(at if outer is None else min(outer, at))
    try:
        yield at
    finally:
        _DEADLINE.reset(token)


@contextlib.contextmanager
def _per_command(seconds: float) -> Iterator[None]:
    """A command's own deadline, ``seconds``, unless the caller's :func:`deadline` is
    set: then that one governs the whole call (a call moving a blob is given longer than
    one command's ``timeout_s``)."""
    if _DEADLINE.get() is not None:
        yield
        return
    with deadline(seconds):
        yield


def time_left() -> float:
    """Seconds to the deadline of this thread's redis call; ``inf`` outside any;
    ``TimeoutError`` (``socket.timeout``) once it passed."""
    at = _DEADLINE.get()
    if at is None:
        return math.inf
    left = at - time.monotonic()
    if left <= 0:
        raise TimeoutError("the redis call's deadline passed")
    return left


def _expired() -> bool:
    at = _DEADLINE.get()
    return at is not None and time.monotonic() >= at


def _within(timeout: float | None, left: float) -> float | None:
    """The shorter of a socket timeout (None: none) and the time left (``inf``: none)."""
    wait = min(math.inf if timeout is None else timeout, left)
    return None if wait == math.inf else wait


def _wait(timeout: float | None, left: float) -> float | None:
    """How long one wait of a call on the socket may last: all that is left of the
    call's deadline (``left``), so that a server busy for longer than ``timeout``
    within the call's deadline is not cut; ``timeout`` outside any deadline."""
    return timeout if left == math.inf else left


class _BoundedSocket:
    """A connected socket (plain or TLS) whose every wait may last until the deadline of
    the call it serves (:func:`time_left`), not past it. A timeout of 0 (a poll) never
    waits; another timeout than the connection's own (``socket_timeout``: a pub/sub
    read's, redis-py's) is kept, if sooner than the deadline."""

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        self._sock, self._timeout, self._own = sock, timeout, timeout

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        if self._timeout == 0:
            self._sock.settimeout(0)
        elif self._timeout == self._own:  # the call's own wait: what is left of it
            self._sock.settimeout(_wait(self._timeout, time_left()))
        else:
            self._sock.settimeout(_within(self._timeout, time_left()))

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return self._sock.recv(*args)

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return self._sock.recv_into(*args)

    def sendall(self, data: Any) -> None:
        """Send in pieces, each waiting only what is left (a TLS socket's own
        ``sendall`` restarts its timeout for every piece)."""
        view = memoryview(data).cast("B")
        while view:
            self._arm()
            view = view[self._sock.send(view) :]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@functools.cache
def _bounded_classes() -> dict[str, Any]:
    """redis-py's client, pipeline and connections (TCP, TLS, unix socket), each call
    bounded by its deadline; made on first use (the registry imports without redis)."""
    import redis  # redis is optional (the redis extra)
    from redis.client import Pipeline  # redis is optional (the redis extra)
    from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection  # optional

    class Bounded:
        """A connection whose connect and handshake also end by the call's deadline,
        and which is closed when a deadline cut an answer short."""

        socket_timeout: float | None
        socket_connect_timeout: float | None

        def _connect(self) -> Any:
            left = time_left()
            saved = self.socket_connect_timeout, self.socket_timeout
            self.socket_connect_timeout = _wait(saved[0], left)
            self.socket_timeout = _wait(saved[1], left)
            try:
                sock = super()._connect()  # type: ignore[misc]
            finally:
                self.socket_connect_timeout, self.socket_timeout = saved
            return _BoundedSocket(sock, self.socket_timeout)

        def _wrap_socket_with_ssl(self, sock: socket.socket) -> Any:
            sock.settimeout(_wait(self.socket_timeout, time_left()))  # the whole handshake
            return super()._wrap_socket_with_ssl(sock)  # type: ignore[misc]

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().read_response(*args, **kwargs)  # type: ignore[misc]
            except BaseException:
                if _expired():  # never leave a half-read answer for the next call
                    self.disconnect()  # type: ignore[attr-defined]
                raise

    class TCP(Bounded, Connection):  # type: ignore[misc]
        pass

    class TLS(Bounded, SSLConnection):  # type: ignore[misc]
        pass

    class Unix(Bounded, UnixDomainSocketConnection):  # type: ignore[misc]
        pass

    class BoundedPipeline(Pipeline):  # type: ignore[misc]
        """A pipeline whose execution, and each command under WATCH, ends within
        ``call_s`` (or the caller's :func:`deadline`)."""

        call_s = math.inf

        def execute(self, *args: Any, **kwargs: Any) -> Any:
            with _per_command(self.call_s):
                return super().execute(*args, **kwargs)

        def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
            with _per_command(self.call_s):
                return super().immediate_execute_command(*args, **options)  # type: ignore[no-untyped-call]

        def reset(self) -> None:  # type: ignore[override]
            """Unwatch within what is left of the call (a connection that cannot, its
            deadline passed or its answer cut, is closed, never left half-read), then
            return the connection to the pool, as redis-py's reset does."""
            connection: Any = self.connection
            if self.watching and connection is not None:
                try:
                    with _per_command(self.call_s):
                        time_left()  # TimeoutError once the deadline passed
                        connection.send_command("UNWATCH")
                        connection.read_response()
                except (redis.exceptions.RedisError, OSError):  # TimeoutError included
                    connection.disconnect()
                self.watching = False
            super().reset()

    class Client(redis.Redis):  # type: ignore[misc]
        """A client whose every command ends within ``call_s`` (or the caller's
        :func:`deadline`)."""

        call_s = math.inf

        def execute_command(self, *args: Any, **options: Any) -> Any:
            with _per_command(self.call_s):
                return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
            pipe = BoundedPipeline(
                self.connection_pool, self.response_callbacks, transaction, shard_hint
            )
            pipe.call_s = self.call_s
            return pipe

    return {"client": Client, "redis": TCP, "rediss": TLS, "unix": Unix}


@dataclass(frozen=True)
class Oversized:
    """A value not read: ``size`` bytes, over the reader's limit."""

    size: int


Read = bytes | Oversized | None  # a bounded read's answer; None: no value


def get(client: Any, key: str, limit: int) -> Any:
    """Ask for ``key``'s value if at most ``limit`` bytes (one round trip, atomic;
    queued on a pipeline). :func:`answer` reads the reply."""
    return client.eval(_GET, 1, key, limit)


def hget(client: Any, key: str, field: str, limit: int) -> Any:
    """:func:`get` for the field ``field`` of the hash ``key``."""
    return client.eval(_HGET, 1, key, field, limit)


def answer(reply: Any) -> Read:
    """A :func:`get` or :func:`hget` reply: the value, :class:`Oversized`, or None."""
    if len(reply) < 2:
        return Oversized(int(reply[0]))
    value: bytes | None = reply[1]
    return value


@dataclass(frozen=True)
class Fields:
    """A hash read within limits: the fields read, and those left out (a few named,
    with their sizes, and how many in all)."""

    values: dict[bytes, bytes]
    oversized: dict[bytes, int]
    skipped: int


def hgetall(client: Any, key: str, *, limit: int, budget: int, most: int) -> Any:
    """Ask for the fields of the hash ``key`` whose values are at most ``limit`` bytes,
    at most ``most`` of them and ``budget`` bytes together (queued on a pipeline).
    :func:`fields` reads the reply."""
    return client.eval(_HGETALL, 1, key, limit, budget, most, FIELD_NAME_BYTES, NAMED_OVERSIZED)


def fields(reply: Any) -> Fields:
    """An :func:`hgetall` reply."""
    found, over, skipped = reply
    values = dict(zip(found[::2], found[1::2], strict=True))
    oversized = {f: int(n) for f, n in zip(over[::2], over[1::2], strict=True)}
    return Fields(values, oversized, int(skipped))


def cause(error: Exception) -> str:
    """Why a redis call failed, in the operating system's words where there are some
    ("Connection refused")."""
    inner = error.__context__
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return str(error).rstrip(".") or type(error).__name__
