"""The sidecar's HTTP server: probes answered whatever its other clients do.

One asyncio loop in a daemon thread holds every connection as a protocol object of a few
KiB, so slow, silent or hostile clients cost memory, never a thread the probes need. HTTP is
parsed by h11 (python-hyper's sans-IO HTTP/1.1: strict RFC 9112 parsing, a size limit,
an error status for each violation; uvicorn's and httpx's parser), never by hand here.
A request head must arrive within one deadline; past the connection cap the connection
that has waited longest without a complete head is closed, or else the one whose answer has
been stalled longest (a client that does not read), so a kubelet's probe always gets in.
Answers that may block (files) run in small pools of daemon threads of their own; the rest
run on the loop. One request per connection (``Connection: close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import resource
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from http import HTTPStatus
from typing import ParamSpec, TypeVar, cast

import h11

from registry.core.errors import BadInput, named

log = logging.getLogger(__name__)

Answer = tuple[int, str, bytes]  # (status, Content-Type, body)
JSON = "application/json"
MAX_LINE = 8 * 1024  # a longer request line is answered 414
MAX_HEAD = 16 * 1024  # a longer request head is answered 431
LINGER_BYTES = 256 * 1024  # read at most this much of what a client sends after its answer
FD_RESERVE = 256  # descriptors kept for what the sidecar reads and watches
BACKLOG = 1024  # connections the kernel queues for accept: a full queue drops a probe's SYN
WARN_EVERY_S = 60.0  # answers that could not be sent: one warning at most this often
P = ParamSpec("P")
T = TypeVar("T")


class SidecarError(BadInput, RuntimeError):
    """The sidecar cannot start: its port is taken, its address is not this host's."""


class Refused(Exception):
    """A request answered with an error status (``status``), saying why (``reason``)."""

    def __init__(self, status: int, reason: str, *headers: tuple[str, str]) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


class DaemonPool(Executor):
    """A fixed set of daemon threads. ThreadPoolExecutor's threads are joined at
    interpreter exit: an answer stuck on a hung volume would hold the process after
    SIGTERM; these never do."""

    def __init__(self, threads: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[object], Callable[[], object]] | None]
        self._jobs = queue.SimpleQueue()
        self._threads = threads
        for i in range(threads):
            threading.Thread(target=self._work, daemon=True, name=f"{name}-{i}").start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))  # type: ignore[arg-type]
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Ends the threads once their current call returns; never waits for one
        (``wait`` is ignored); calls not started yet are cancelled."""
        with contextlib.suppress(queue.Empty):
            while (job := self._jobs.get_nowait()) is not None:
                job[0].cancel()
        for _ in range(self._threads):
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as e:  # the caller's to see, on its future
                future.set_exception(e)


@dataclass(frozen=True)
class Pool:
    """Daemon threads of their own for the answers to some paths. While every thread is
    busy, a path's last answer made within ``reuse_s`` is given again at once, instead of
    a place in the queue or a 503 (a probe flood must not turn a verdict into 503)."""

    name: str
    threads: int = 2
    reuse_s: float = 0.0


@dataclass(frozen=True)
class Limits:
    """How long and how much each connection may take."""

    head_s: float = 5.0  # for the whole request head: a client dripping bytes is cut
    write_s: float = 5.0  # for the whole answer: a client that never reads is cut
    linger_s: float = 1.0  # reading what a client still sends once answered
    max_connections: int = 1024  # and below the process's descriptor limit
    queued: int = 64  # answers waiting for a pool's threads; more are answered 503


class ProbeServer:
    """Serves ``answer(path)`` for GET and HEAD on ``address``. Paths in ``pools`` are
    answered in their pool's threads (one pool per name: a slow one never delays another),
    every other path on the loop, as its request arrives (its answer must never block).
    An answer that raises is a 500. The port is bound on construction (``OSError`` if it
    cannot be)."""

    def __init__(
        self,
        address: tuple[str, int],
        answer: Callable[[str], Answer],
        *,
        pools: Mapping[str, Pool] | None = None,
        limits: Limits = Limits(),
    ) -> None:
        self.answer, self.limits = answer, limits
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._socket = socket.create_server(address, family=family, backlog=BACKLOG)
        self.port = int(self._socket.getsockname()[1])
        self.max_connections = limits.max_connections
        self._pools = dict(pools or {})
        self._executors: dict[str, DaemonPool] = {}
        self._queued: dict[str, int] = {}  # per pool: answers submitted, not yet returned
        self._last: dict[str, tuple[float, Answer]] = {}  # per path: (made when, answer)
        self._open: set[Exchange] = set()
        self._waiting: dict[Exchange, None] = {}  # no answer due: evictable, oldest first
        self._sending: dict[Exchange, None] = {}  # answers not taken yet: evictable next
        self._unsent = 0  # answers that could not be sent since the last warning
        self._warned = -WARN_EVERY_S  # when that warning was, on the loop's clock
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        self._closed = threading.Event()  # the port is closed
        self._thread = threading.Thread(target=self._run, daemon=True, name="sidecar-http")

    def start(self) -> None:
        """Serve in a daemon thread; the port already takes connections."""
        files = _open_files() - FD_RESERVE
        self.max_connections = min(self.limits.max_connections, max(16, files))
        for pool in set(self._pools.values()):
            self._executors[pool.name] = DaemonPool(pool.threads, f"sidecar-{pool.name}")
            self._queued[pool.name] = 0
        self._thread.start()

    def shutdown(self, timeout: float = 1.0) -> None:
        """Stop accepting and answering: waits at most ``timeout`` for the port to close,
        never for an answer in progress (its thread is a daemon)."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop ended on its own already
                self._loop.call_soon_threadsafe(self._stopping.set)
            self._closed.wait(timeout)
        else:
            self._socket.close()
        for executor in self._executors.values():
            executor.shutdown(wait=False)

    # ---- on the loop ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except Exception:  # the server is down, not the sidecar: say so once
            log.exception("the sidecar's HTTP server failed")
        finally:
            self._socket.close()
            self._closed.set()
            self._loop.close()

    async def _serve(self) -> None:
        server = await self._loop.create_server(
            lambda: Exchange(self), sock=self._socket, backlog=BACKLOG
        )
        await self._stopping.wait()
        server.close()
        self._closed.set()
        for exchange in list(self._open):
            exchange.transport.abort()
        await asyncio.sleep(0)  # their connection_lost callbacks

    def admit(self, exchange: Exchange) -> bool:
        """Whether a new connection may stay: past the cap the one waiting longest for
        its request (or lingering) makes room, else the one whose answer has been stalled
        longest (its client does not read); when every connection waits for its pool's
        answer, none does."""
        if len(self._open) >= self.max_connections:
            evictable = self._waiting or self._sending
            if not evictable:
                log.debug("refused a connection: %d are being answered", len(self._open))
                return False
            oldest = next(iter(evictable))
            self.forget(oldest)
            oldest.transport.abort()
        self._open.add(exchange)
        self._waiting[exchange] = None
        return True

    def forget(self, exchange: Exchange) -> None:
        self._open.discard(exchange)
        self._waiting.pop(exchange, None)
        self._sending.pop(exchange, None)

    def sending(self, exchange: Exchange) -> None:
        if exchange in self._open:
            self._waiting.pop(exchange, None)
            self._sending[exchange] = None  # stalled from now, if its client does not read

    def answer_to(self, exchange: Exchange, request: h11.Request) -> None:
        """Answer ``request`` now, or once its pool has."""
        self._waiting.pop(exchange, None)  # being answered: never evicted
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        pool = self._pools.get(path)
        if pool is None:
            exchange.respond(*self._call(path))
            return
        name = pool.name
        if self._queued[name] >= pool.threads and (last := self._fresh(path, pool)):
            exchange.respond(*last)  # every thread busy: the answer of a moment ago
            return
        if self._queued[name] >= self.limits.queued:  # a storm: refuse, hold nothing more
            reason = f"{self._queued[name]} answers to {path} are queued already"
            exchange.respond(HTTPStatus.SERVICE_UNAVAILABLE, JSON, _error(reason))
            return
        self._queued[name] += 1
        future = self._loop.run_in_executor(self._executors[name], self._call, path)
        exchange.pending = future
        future.add_done_callback(lambda done: self._answered(name, path, exchange, done))

    def _fresh(self, path: str, pool: Pool) -> Answer | None:
        made, answer = self._last.get(path, (float("-inf"), None))
        return answer if self._loop.time() - made <= pool.reuse_s else None

    def _answered(
        self, pool: str, path: str, exchange: Exchange, done: asyncio.Future[Answer]
    ) -> None:
        self._queued[pool] -= 1
        if done.cancelled():  # the connection is gone
            return
        if (error := done.exception()) is not None:
            self.unsent(exchange, error)
            return
        self._last[path] = self._loop.time(), done.result()
        exchange.respond(*done.result())

    def unsent(self, exchange: Exchange, error: BaseException) -> None:
        """An answer could not be made or sent: close its connection, quietly (junk must
        never flood the log from the loop); one warning a minute says how many."""
        exchange.transport.abort()
        log.debug("answer not sent, connection closed: %r", error)
        self._unsent += 1
        now = self._loop.time()
        if now - self._warned >= WARN_EVERY_S:
            log.warning("%d answers could not be sent (last: %r)", self._unsent, error)
            self._unsent, self._warned = 0, now

    def lingering(self, exchange: Exchange) -> None:
        if exchange in self._open:
            self._sending.pop(exchange, None)
            self._waiting[exchange] = None  # answered: evictable first again

    def _call(self, path: str) -> Answer:
        try:
            return self.answer(path)
        except Exception as e:  # answer, never drop the connection
            log.exception("answering %s failed", path)
            return HTTPStatus.INTERNAL_SERVER_ERROR, JSON, _error(named(e))


class Exchange(asyncio.Protocol):
    """One connection, one request: its head read under a deadline, its answer written
    under another, then what the client still sends read briefly (a socket closed with
    unread bytes resets the connection, and the reset can destroy the answer before the
    client reads it: the client of a 414 is still sending its line). Callbacks, no task:
    a connection costs this object, its transport, its parser and a timer."""

    def __init__(self, server: ProbeServer) -> None:
        self.server, self.limits = server, server.limits
        self.head = Head()
        self.request: h11.Request | None = None
        self.pending: asyncio.Future[Answer] | None = None  # an answer from a pool
        self.state = "head"  # then "answering", "sending", "lingering"
        self._loop = asyncio.get_running_loop()  # made by the server, on its loop
        self._timer: asyncio.TimerHandle | None = None
        self._writable = True
        self._ended = False  # the client sent all it will
        self._discarded = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=0)  # told when all is sent
        if not self.server.admit(self):
            self.transport.abort()
            return
        self._after(self.limits.head_s, self._late)

    def data_received(self, data: bytes) -> None:
        if self.state == "head":
            self._feed(data)
        elif self.state == "lingering":
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES:
                self.transport.abort()

    def eof_received(self) -> bool:
        self._ended = True
        if self.state == "head" and self.head.size:
            self._feed(b"")  # refused: the client may still read the answer
        elif self.state in ("head", "lingering"):
            self.transport.abort()
        return True  # half-closed: the answer still goes out

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.forget(self)
        self._cancel_timer()
        if self.pending is not None:
            self.pending.cancel()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        if self.state == "sending":
            self._sent()

    def respond(self, status: int, kind: str, body: bytes, *headers: tuple[str, str]) -> None:
        """Send the one answer of this connection; a client that does not take it within
        ``write_s`` is cut."""
        if self.transport.is_closing():
            return
        try:
            data = self.head.respond(status, kind, body, headers)
        except Exception as e:  # never a traceback per request: close, say so quietly
            self.server.unsent(self, e)
            return
        self.state = "sending"
        self._after(self.limits.write_s, self.transport.abort)
        self.transport.write(data)
        if self._writable:
            self._sent()
        else:
            self.server.sending(self)

    def _feed(self, data: bytes) -> None:
        try:
            self.request = self.head.feed(data)
        except Refused as e:
            self.respond(e.status, JSON, _error(e.reason), *e.headers)
            return
        except Exception as e:  # a parser's bug: this connection's, not the loop's
            self.server.unsent(self, e)
            return
        if self.request is not None:
            self.state = "answering"  # as long as its pool takes: no deadline here
            self._cancel_timer()
            try:
                self.server.answer_to(self, self.request)
            except Exception as e:
                self.server.unsent(self, e)

    def _late(self) -> None:
        if not self.head.size:  # silent all along: nobody to tell
            self.transport.abort()
            return
        reason = f"no complete request within {self.limits.head_s:g} s"
        self.respond(HTTPStatus.REQUEST_TIMEOUT, JSON, _error(reason))

    def _sent(self) -> None:
        if self._ended:  # nothing left to read: done
            self.transport.abort()
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.state = "lingering"
        self.server.lingering(self)
        self._after(self.limits.linger_s, self.transport.abort)

    def _after(self, seconds: float, call: Callable[[], object]) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(seconds, call)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Head:
    """One request head as it arrives. h11 parses it; this adds what h11 leaves to the
    server: a bound on the request line (414, told from a long header's 431) and on the
    whole head (h11 bounds only a head still incomplete), and a request line without an
    HTTP version (HTTP/0.9, garbage) refused at its line end, not after a blank line that
    such a client never sends."""

    def __init__(self) -> None:
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.size = 0  # bytes received
        self.method = b""  # once parsed, even for a request refused: HEAD's answer has no body
        self._line: bytearray | None = bytearray()  # the request line until its end came

    def feed(self, chunk: bytes) -> h11.Request | None:
        """The request once its head is complete, None until then (``b""``: the client
        closed); raises ``Refused`` for a head that gets none."""
        self.size += len(chunk)
        if self._line is not None:
            self._check_line(chunk)
        if self.size > MAX_HEAD:
            raise Refused(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD} bytes"
            )
        self.http.receive_data(chunk)
        try:
            event = self.http.next_event()
        except h11.RemoteProtocolError as e:
            raise Refused(e.error_status_hint, str(e)) from None
        if not isinstance(event, h11.Request):
            return None
        self.method = event.method
        if event.http_version not in (b"1.0", b"1.1"):
            raise Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "HTTP/1.0 and HTTP/1.1 only")
        if event.method not in (b"GET", b"HEAD"):
            raise Refused(HTTPStatus.METHOD_NOT_ALLOWED, "GET or HEAD only", ("Allow", "GET, HEAD"))
        return event

    def respond(
        self,
        status: int,
        kind: str,
        body: bytes,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """The bytes of one answer, the last on this connection (its head alone for
        HEAD)."""
        fields = [
            ("Content-Type", kind),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *headers,
        ]
        reason = HTTPStatus(status).phrase.encode()
        events: list[h11.Event] = [h11.Response(status_code=status, headers=fields, reason=reason)]
        events += [] if self.method == b"HEAD" else [h11.Data(data=body)]
        return b"".join(self.http.send(event) or b"" for event in [*events, h11.EndOfMessage()])

    def _check_line(self, chunk: bytes) -> None:
        assert self._line is not None  # feed checks lines until the first has ended
        self._line += chunk[: MAX_LINE + 1 - len(self._line)]
        end = self._line.find(b"\n")
        if end < 0:
            if len(self._line) > MAX_LINE:
                raise Refused(
                    HTTPStatus.REQUEST_URI_TOO_LONG, f"request line over {MAX_LINE} bytes"
                )
            if not chunk:
                raise Refused(HTTPStatus.BAD_REQUEST, "the request line has no end")
            return
        method_target_version = bytes(self._line[:end]).rstrip(b"\r").split(b" ")
        self._line = None
        if len(method_target_version) != 3 or not method_target_version[2].startswith(b"HTTP/"):
            raise Refused(
                HTTPStatus.BAD_REQUEST, "not an HTTP/1 request line (method target HTTP/1.x)"
            )


def _error(reason: str) -> bytes:
    return json.dumps({"error": reason}).encode()


def _open_files() -> int:
    """The process's descriptor limit, its soft limit raised to the hard one first (a
    connection holds one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
