"""A hostile redis server for deadline tests: it accepts connections and answers each
with ``payload``, one byte every ``every_s`` seconds, for ever (an answer that never
ends, or bytes that are no answer at all), so that no single ``recv`` ever times out."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

SLOW_BULK = b"$100000000\r\n" + b"x" * 10_000  # valid RESP: a 100 MB string, never done
GARBAGE = b"\x00\x01?" * 10_000  # not RESP: nothing to parse until it ends
TLS_RECORD = b"\x16\x03\x03\x40\x00" + b"\x00" * 10_000  # a TLS handshake record, trickled


class Trickle:
    """The server on ``url``: TCP (``redis://``), TLS (``rediss://``: with ``cert``
    the handshake completes, then the payload trickles; without, the handshake itself
    trickles) or a unix socket."""

    def __init__(
        self,
        kind: str,
        folder: Path,
        payload: bytes = SLOW_BULK,
        every_s: float = 0.5,
        cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.payload, self.every_s, self._closed = payload, every_s, False
        self._context: ssl.SSLContext | None = None
        if cert is not None:
            self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._context.load_cert_chain(*cert)
        if kind == "unix":
            path = folder / "trickle.sock"
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(str(path))
            self.listener.listen()
            self.url = f"unix://{path}"
        else:
            self.listener = socket.create_server(("127.0.0.1", 0))
            port = self.listener.getsockname()[1]
            scheme = "rediss" if kind == "tls" else "redis"
            query = "?ssl_cert_reqs=none" if kind == "tls" else ""
            self.url = f"{scheme}://127.0.0.1:{port}/0{query}"
        self.listener.settimeout(0.1)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, ssl.SSLError), conn:
            conn.settimeout(None)
            if self._context is not None:
                conn = self._context.wrap_socket(conn, server_side=True)
            for byte in self.payload:
                if self._closed:
                    return
                conn.sendall(bytes([byte]))
                time.sleep(self.every_s)

    def close(self) -> None:
        self._closed = True
        self.listener.close()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate and its key for localhost, made by openssl."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@contextlib.contextmanager
def trickling(kind: str, folder: Path, payload: bytes = SLOW_BULK) -> Iterator[Trickle]:
    """A :class:`Trickle` of ``kind``: "tcp", "unix", "tls-handshake" or "tls"."""
    cert = self_signed(folder) if kind == "tls" else None
    payload = TLS_RECORD if kind == "tls-handshake" else payload
    server = Trickle("tls" if kind.startswith("tls") else kind, folder, payload, cert=cert)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """The block ends within ``seconds`` (asserted)."""
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    assert took <= seconds, f"took {took:.2f} s; limit {seconds:.2f} s"


@contextlib.contextmanager
def throttled(
    upstream: int,
    *,
    down_bytes_per_s: float | None = None,
    up_bytes_per_s: float | None = None,
    stall_s: float = 0.0,
) -> Iterator[str]:
    """A local TCP proxy to the redis server on port ``upstream``; yields its URL. The
    server's answers reach the client at ``down_bytes_per_s`` (None: as they come), each
    after ``stall_s`` (a busy server, slow to start an answer); the client's commands
    reach the server at ``up_bytes_per_s``."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def pump(
        src: socket.socket, dst: socket.socket, rate: float | None, up: bool, asked: list[int]
    ) -> None:
        answered, due = 0, 0.0  # due: when the bytes sent so far may have gone, at ``rate``
        try:
            while not stop.is_set() and (data := src.recv(256 * 2**10)):
                if asked[0] != answered and not up:  # a new answer: the server is busy first
                    time.sleep(stall_s)
                    answered = asked[0]
                if up:
                    asked[0] += 1  # before the server sees it: its answer comes after
                if rate:  # a schedule, not a pause a piece: the rate holds under load too
                    due = max(due, time.monotonic()) + len(data) / rate
                    time.sleep(max(0.0, due - time.monotonic()))
                dst.sendall(data)
        except OSError:
            pass

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", upstream))
            asked = [0]  # commands forwarded on this connection
            for args in (
                (client, server, up_bytes_per_s, True),
                (server, client, down_bytes_per_s, False),
            ):
                threading.Thread(target=pump, args=(*args, asked), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        stop.set()
        listener.close()
