"""The redis lock through outages: a real redis-server behind a TCP proxy that a test
switches down (connections reset, new ones refused) or stalls (a hung server)."""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry import LockTimeout, RegistryError, Store, lock
from registry.locks import Holder, backend_from_url
from registry.locks.redis_lock import PREFIX
from tests.conftest import error_line, free_port, write_manifest
from tests.registry import _workers

LOCK = "tune/outage"
KEY = PREFIX + LOCK


class Redis:
    """A redis-server on a free TCP port in ``folder``, persisting nothing."""

    def __init__(self, folder: Path) -> None:
        server = shutil.which("redis-server")
        assert server is not None
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), *options, "--dir", str(folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = backend_from_url(self.url).client  # type: ignore[attr-defined]
        deadline = time.monotonic() + 15
        while not self._answers():
            assert self.proc.poll() is None and time.monotonic() < deadline, "no redis-server"
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class Proxy:
    """A TCP proxy to ``port`` on one thread. ``down()``: every open connection is reset
    and the listener closed (connection refused); ``stall()``: connections stay open and
    what they carry is dropped (a hung server); ``up()``: back to forwarding."""

    def __init__(self, port: int) -> None:
        self.target, self.port = port, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._mode, self._asked, self._closed = "up", 0, False
        self._applied = threading.Condition()
        self._done = 0  # switches applied, of the ``_asked`` ones
        self._thread = threading.Thread(target=self._serve, daemon=True, name="redis-proxy")
        self._thread.start()
        self._switch("up")

    def up(self) -> None:
        self._switch("up")

    def down(self) -> None:
        self._switch("down")

    def stall(self) -> None:
        self._switch("stall")

    def outage(self, seconds: float, mode: str = "down") -> threading.Timer:
        """Switch to ``mode`` now and back up after ``seconds``."""
        self._switch(mode)
        timer = threading.Timer(seconds, self.up)
        timer.start()
        return timer

    def close(self) -> None:
        self._closed = True
        self._thread.join()

    def _switch(self, mode: str) -> None:
        with self._applied:
            self._mode, self._asked = mode, self._asked + 1
            asked = self._asked
            assert self._applied.wait_for(lambda: self._done >= asked, 5), "no switch"

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        peers: dict[socket.socket, socket.socket] = {}
        listener: socket.socket | None = None
        applied, done = "", 0
        while not self._closed:
            if self._asked != done:
                done, applied = self._asked, self._mode
                if applied == "down":
                    for s in list(peers):
                        self._drop(sel, peers, s, reset=True)
                    if listener is not None:
                        sel.unregister(listener)
                        listener.close()
                        listener = None
                elif listener is None:
                    listener = socket.create_server(("127.0.0.1", self.port))
                    sel.register(listener, selectors.EVENT_READ)
                with self._applied:
                    self._done = done
                    self._applied.notify_all()
            for event, _ in sel.select(0.01):
                s = event.fileobj
                assert isinstance(s, socket.socket)
                if s is listener:
                    self._accept(sel, peers, listener)
                elif s in peers:
                    self._pump(sel, peers, s, forward=applied == "up")
        for s in list(peers):
            self._drop(sel, peers, s, reset=True)
        if listener is not None:
            listener.close()

    def _accept(self, sel: selectors.BaseSelector, peers: dict, listener: socket.socket) -> None:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target))
        peers[client], peers[upstream] = upstream, client
        for s in (client, upstream):
            sel.register(s, selectors.EVENT_READ)

    def _pump(self, sel: selectors.BaseSelector, peers: dict, s: socket.socket, forward: bool):
        try:
            data = s.recv(65536)
            if data and forward:
                peers[s].sendall(data)
        except OSError:
            data = b""
        if not data:
            self._drop(sel, peers, s, reset=False)

    @staticmethod
    def _drop(sel: selectors.BaseSelector, peers: dict, s: socket.socket, reset: bool) -> None:
        if s not in peers:  # its peer went first
            return
        other = peers.pop(s)
        del peers[other]
        for sock in (s, other):
            sel.unregister(sock)
            if reset:  # an RST, as from a crashed server, not a polite FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()


@pytest.fixture(scope="module")
def redis(tmp_path_factory) -> Iterator[Redis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it where apt-get works)")
    server = Redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def proxy(redis: Redis) -> Iterator[Proxy]:
    redis.client.flushall()
    p = Proxy(redis.port)
    yield p
    p.close()


class Contender(threading.Thread):
    """Takes the lock over its own direct connection as soon as it can, then holds it
    until ``done`` is set; says when it got it and whether the other holder knew then
    that it had lost the lock."""

    def __init__(self, url: str, ttl: float, other: Holder | None = None) -> None:
        super().__init__(daemon=True, name="contender")
        self.backend, self.ttl, self.other = backend_from_url(url), ttl, other
        self.acquired, self.done = threading.Event(), threading.Event()
        self.acquired_at = 0.0
        self.other_lost_then: bool | None = None
        self.me: Holder | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while not self.done.is_set() and time.monotonic() < deadline:
            try:
                with lock(LOCK, ttl=self.ttl, timeout=0.1, backend=self.backend) as me:
                    self.acquired_at, self.me = time.monotonic(), me
                    self.other_lost_then = self.other.lost if self.other is not None else None
                    self.acquired.set()
                    self.done.wait(30)
                return
            except LockTimeout:
                continue


@pytest.fixture
def contenders(redis: Redis) -> Iterator[Callable[..., Contender]]:
    made: list[Contender] = []

    def make(ttl: float, other: Holder | None = None) -> Contender:
        made.append(Contender(redis.url, ttl, other))
        return made[-1]

    yield make
    for contender in made:
        contender.done.set()
        contender.join(10)


# ---- waiters -------------------------------------------------------------------------------


def test_a_waiter_retries_an_unreachable_redis_until_its_timeout_then_names_it(caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="registry.locks"),
        pytest.raises(RegistryError) as info,
        lock("nowhere", ttl=2, timeout=1.0, backend=backend_from_url(url)),
    ):
        pass
    waited = time.monotonic() - started
    message = str(info.value)
    assert url in message and "Connection refused" in message and "redis" in message
    assert 1.0 <= waited < 3.0  # retried until its own timeout, not raised at once
    retries = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert 1 <= len(retries) <= 2  # logged, rate-limited


def test_outage_s_gives_up_on_a_silent_server_before_the_timeout():
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with (
        pytest.raises(RegistryError, match="Connection refused"),
        lock("nowhere", ttl=2, timeout=30, outage_s=0.5, backend=backend_from_url(url)),
    ):
        pass
    assert 0.5 <= time.monotonic() - started < 3


def test_many_tries_during_one_outage_log_it_once_per_interval(caplog, monkeypatch):
    backend = backend_from_url(f"redis://127.0.0.1:{free_port()}/0")
    with caplog.at_level(logging.WARNING, logger="registry.locks"):
        for i in range(20):  # a run trying one shape after another
            with (
                pytest.raises(RegistryError),
                lock(f"shape-{i}", ttl=2, timeout=0, backend=backend),
            ):
                pass
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1


def test_a_waiter_keeps_waiting_through_an_outage_and_acquires_after_it(redis, proxy):
    held = redis.client.lock(KEY, timeout=30)
    assert held.acquire(blocking=False)
    got: list[float] = []

    def wait() -> None:
        with lock(LOCK, ttl=3, timeout=15, backend=backend_from_url(proxy.url)):
            got.append(time.monotonic())

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(0.3)  # the waiter polls through the proxy
    proxy.down()
    held.release()  # freed while the waiter cannot see it
    time.sleep(3.0)  # longer than redis-py's own retries of one command
    assert not got
    up = time.monotonic()
    proxy.up()
    waiter.join(10)
    assert got and got[0] >= up


# ---- the holder ----------------------------------------------------------------------------


def test_a_holder_keeps_its_lock_through_an_outage_shorter_than_its_ttl(redis, proxy, contenders):
    ttl = 6.0
    contender = contenders(ttl)
    with lock(LOCK, ttl=ttl, timeout=5, backend=backend_from_url(proxy.url)) as me:
        contender.start()
        proxy.outage(4.0).join()
        time.sleep(1.0)  # the heartbeat's retries reach redis again
        assert not contender.acquired.is_set(), "a second holder got the lock"
        assert redis.client.pttl(KEY) > (ttl - 1.5) * 1000  # renewed after the outage
        assert me is not None and not me.lost
        released = time.monotonic()
    assert contender.acquired.wait(5)  # released cleanly: the contender is next
    contender.done.set()
    assert contender.acquired_at >= released


def test_a_hung_redis_cannot_outlast_the_lease(redis, proxy, contenders):
    ttl = 4.0
    contender = contenders(ttl)
    with lock(LOCK, ttl=ttl, timeout=5, backend=backend_from_url(proxy.url)) as me:
        contender.start()
        proxy.outage(1.5, mode="stall").join()  # requests vanish: only socket timeouts end them
        time.sleep(ttl - 1.0)  # past the lease's end had the heartbeat hung
        assert not contender.acquired.is_set(), "a second holder got the lock"
        assert me is not None and not me.lost
    assert contender.acquired.wait(5)
    contender.done.set()


def test_an_outage_longer_than_the_ttl_loses_the_lock_and_both_results_are_kept(
    redis, proxy, contenders, tmp_path, caplog
):
    ttl = 1.5
    store = Store(tmp_path / "registry", create=True)
    with (
        caplog.at_level(logging.WARNING, logger="registry.locks"),
        lock(LOCK, ttl=ttl, timeout=5, backend=backend_from_url(proxy.url)) as me,
    ):
        assert me is not None
        contender = contenders(ttl, other=me)
        contender.start()
        proxy.down()
        assert contender.acquired.wait(ttl * 4), "the lease never expired"
        assert contender.other_lost_then is True  # knew before the other got in
        assert me.lost
        store.put(_workers.entry(4096, 64))  # both finish their tuning: merged, not lost
        store.put(_workers.entry(4096, 128))
        proxy.up()
        time.sleep(ttl / 2)  # a heartbeat that would still run could renew now
        assert contender.me is not None
        assert Holder.parse(redis.client.get(KEY)) == contender.me
    assert Holder.parse(redis.client.get(KEY)) == contender.me  # release left it alone
    contender.done.set()
    contender.join(5)
    assert redis.client.get(KEY) is None
    said = [r.getMessage() for r in caplog.records if r.name.startswith("registry.locks")]
    assert len([m for m in said if "lost while held" in m]) == 1  # said once
    assert not [m for m in said if "release" in m]  # the release after it is quiet
    (entry,) = Store(tmp_path / "registry").entries()
    assert sorted(m.config.meta["BLOCK_M"] for m in entry.measurements) == [64, 128]


def test_a_holder_whose_key_another_owns_stops_claiming_it(redis, proxy):
    with lock(LOCK, ttl=3, timeout=5, backend=backend_from_url(proxy.url)) as me:
        assert me is not None and not me.lost
        other = Holder.me("someone-else").to_text()
        redis.client.set(KEY, other, px=30_000)  # as after an expiry this holder missed
        deadline = time.monotonic() + 2
        while not me.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert me.lost
    assert redis.client.get(KEY).decode() == other
    assert redis.client.pttl(KEY) > 25_000  # never extended as if it were ours


def test_a_set_whose_reply_was_lost_is_recognised_as_ours(redis, proxy, monkeypatch):
    import redis as redis_py

    real = redis_py.lock.Lock.do_acquire
    calls = []

    def reply_lost(self, token):
        calls.append(token)
        landed = real(self, token)
        if len(calls) == 1:
            raise redis_py.exceptions.TimeoutError("Timeout reading from socket")
        return landed

    monkeypatch.setattr(redis_py.lock.Lock, "do_acquire", reply_lost)
    started = time.monotonic()
    with lock(LOCK, ttl=4, timeout=10, backend=backend_from_url(proxy.url)) as me:
        waited = time.monotonic() - started
        assert redis.client.get(KEY).decode() == me.to_text()
    assert waited < 2  # once: it waited on its own key for the whole 4 s ttl
    assert len(calls) == 1 and redis.client.get(KEY) is None  # released as ours


def test_a_failover_answer_is_retried_like_an_outage(redis, proxy, monkeypatch):
    import redis as redis_py

    real = redis_py.lock.Lock.do_acquire
    calls = []

    def read_only(self, token):
        calls.append(token)
        if len(calls) <= 2:
            raise redis_py.exceptions.ReadOnlyError("You can't write against a read only replica.")
        return real(self, token)

    monkeypatch.setattr(redis_py.lock.Lock, "do_acquire", read_only)
    with lock(LOCK, ttl=3, timeout=10, backend=backend_from_url(proxy.url)) as me:
        assert me is not None and not me.lost  # once: ReadOnlyError escaped the waiter
    assert len(calls) == 3


# ---- triton-warmup run ---------------------------------------------------------------------

MANIFEST = """
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}
"""


def _run(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    manifest = write_manifest(folder / "m.yaml", MANIFEST)
    return subprocess.run(
        [sys.executable, "-m", "warmup", "run", "--manifest", str(manifest), "--device", "cpu"],
        cwd=folder,
        env={**os.environ, "TRITON_WARMUP_CREATE_VOLUME": "true", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_with_redis_unreachable_fails_before_any_rank_in_one_line(isolated):
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = _run(isolated, TRITON_WARMUP_LOCK_URL=url)
    line = error_line(done.stderr)
    assert done.returncode == 2
    assert f"lock server {url} unreachable (Connection refused)" in line
    assert "TRITON_WARMUP_LOCK_URL" in line and "TRITON_WARMUP_LOCK_FALLBACK=file" in line
    assert not (isolated / "work_dir" / "status.json").exists()  # no rank started


def test_run_with_redis_unreachable_and_the_file_fallback_warms_with_file_leases(isolated):
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = _run(isolated, TRITON_WARMUP_LOCK_URL=url, TRITON_WARMUP_LOCK_FALLBACK="file")
    assert done.returncode == 0, done.stderr
    assert "falling back to file leases" in done.stderr and url in done.stderr
    locks = isolated / "volume" / "locks"
    given = json.loads((isolated / "work_dir" / "run" / "settings.json").read_text())
    assert given["locks"]["url"] == str(locks)  # what every rank reads: one backend for all
    status = json.loads((isolated / "work_dir" / "status.json").read_text())
    assert status["state"] == "ready" and status["sources"] == {"tuned": 1}
