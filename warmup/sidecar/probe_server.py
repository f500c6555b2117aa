"""An HTTP server whose threads stay bounded whatever its clients do: the sidecar's.

Idle connections wait in one selector and hold no thread; requests are answered by a
fixed pool of daemon threads with a bounded queue; ``shutdown`` returns within its
timeout whatever the handlers are doing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

log = logging.getLogger(__name__)


class SidecarError(RuntimeError):
    """The sidecar cannot start: its port is taken, its address is not this host's."""


class ProbeServer(HTTPServer):
    """An HTTP server whose threads stay bounded however many clients connect.

    A connection waits in one selector, holding no thread, until its request arrives; one
    silent for ``idle_s`` is closed, and past ``max_waiting`` the longest waiting is. A
    request is answered by one of ``workers`` daemon threads (a slow answer never holds
    the process at exit); when ``backlog`` requests already wait for one, the connection
    is closed at once. One request per connection (HTTP/1.0)."""

    request_queue_size = 128  # the listen backlog: probes and scrapes come in bursts

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        workers: int = 16,
        backlog: int = 64,
        max_waiting: int = 256,
        idle_s: float = 5.0,
    ) -> None:
        self.workers, self.max_waiting, self.idle_s = workers, max_waiting, idle_s
        self._requests: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(
            max(backlog, workers)
        )
        self._waiting: dict[socket.socket, float] = {}  # connection -> deadline, oldest first
        self._closing = threading.Event()
        self._closed = threading.Event()
        self._wake_loop, self._wake_sender = socket.socketpair()  # shutdown wakes the loop
        super().__init__(address, handler)  # binds; closes everything (server_close) if it fails

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        for i in range(self.workers):
            threading.Thread(target=self._work, daemon=True, name=f"sidecar-http-{i}").start()
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_loop, selectors.EVENT_READ)
            try:
                while not self._closing.is_set():
                    try:
                        self._turn(selector, poll_interval)
                    except Exception:  # the loop is the server: it never dies of one event
                        log.exception("the sidecar's HTTP loop failed one turn; going on")
            finally:
                for connection in list(self._waiting):
                    self._drop(selector, connection)
                self._closed.set()

    def _turn(self, selector: selectors.BaseSelector, poll_interval: float) -> None:
        for key, _ in selector.select(poll_interval):
            if key.fileobj is self.socket:
                self._accept(selector)
            elif key.fileobj in self._waiting:  # not dropped by an accept of this same batch
                self._hand_over(selector, key.fileobj, key.data)  # type: ignore[arg-type]
        self._expire(selector)

    def shutdown(self, timeout: float = 1.0) -> None:
        """Stop accepting and answering; waits at most ``timeout`` for the loop, never for
        an answer in progress. Requests no worker took yet are closed unanswered."""
        self._closing.set()
        with contextlib.suppress(OSError):
            self._wake_sender.send(b"x")
        self._closed.wait(timeout)
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._requests.get_nowait()
                if item is not None:
                    self.shutdown_request(item[0])
        for _ in range(self.workers):
            with contextlib.suppress(queue.Full):
                self._requests.put_nowait(None)

    def server_close(self) -> None:
        super().server_close()
        self._wake_loop.close()
        self._wake_sender.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # mostly a client that went away or was too slow: not worth a traceback on stderr
        log.debug("connection from %s failed", client_address, exc_info=True)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                connection, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as e:  # out of file descriptors, say: try again shortly
                log.warning("cannot accept a connection: %s", e)
                self._closing.wait(0.1)
                return
            if len(self._waiting) >= self.max_waiting:
                self._drop(selector, next(iter(self._waiting)))
            connection.setblocking(True)
            self._waiting[connection] = time.monotonic() + self.idle_s
            selector.register(connection, selectors.EVENT_READ, address)

    def _hand_over(
        self, selector: selectors.BaseSelector, connection: socket.socket, address: Any
    ) -> None:
        del self._waiting[connection]
        selector.unregister(connection)
        try:
            self._requests.put_nowait((connection, address))
        except queue.Full:  # every worker busy, the backlog full: refuse, hold nothing
            log.debug("refused %s: %d requests wait already", address, self._requests.qsize())
            self.shutdown_request(connection)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._waiting:
            connection, deadline = next(iter(self._waiting.items()))
            if deadline > now:
                return
            self._drop(selector, connection)

    def _drop(self, selector: selectors.BaseSelector, connection: socket.socket) -> None:
        del self._waiting[connection]
        selector.unregister(connection)
        self.shutdown_request(connection)

    def _work(self) -> None:
        while (item := self._requests.get()) is not None:
            connection, address = item
            try:
                self.finish_request(connection, address)
            except Exception:
                self.handle_error(connection, address)
            finally:
                self.shutdown_request(connection)


class HeadFirstHandler(BaseHTTPRequestHandler):
    """A request handler that reads the whole request head first, within ``timeout``
    seconds in all (not per read: a client dripping a byte at a time is cut at the
    deadline) and ``MAX_HEAD`` bytes, then parses it. For GET-only servers (no body)."""

    timeout = 5.0
    MAX_HEAD = 16 * 1024

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BytesIO(_read_head(self.connection, self.timeout, self.MAX_HEAD))


def _read_head(connection: socket.socket, timeout: float, limit: int) -> bytes:
    """Bytes up to the blank line that ends a request head (or ``limit`` bytes, or what
    arrived by the deadline: the parser then answers 400 or drops it)."""
    deadline = time.monotonic() + timeout
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        connection.settimeout(left)
        try:
            chunk = connection.recv(min(4096, limit - len(head)))
        except TimeoutError:
            break
        if not chunk:
            break
        head += chunk
    connection.settimeout(timeout)  # the answer's writes: a client that never reads is cut
    return head
