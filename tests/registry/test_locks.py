import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import registry.locks
from registry import LockTimeout, RegistryError, lock
from registry.locks import Holder, backend_from_url, lock_file_name
from registry.locks.redis_lock import PREFIX
from tests.conftest import free_port, wait_for
from tests.registry import _workers
from tests.registry._trickle import trickling, within

ROOT = Path(__file__).parents[2]


@pytest.fixture(params=["file", "redis"])
def lock_url(request, tmp_path):
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        backend_from_url(url).client.flushall()
        return url
    return str(tmp_path / "locks")


def _start_holder(lock_url, name, ttl, tmp_path):
    ready = tmp_path / f"ready-{lock_file_name(name)}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.registry._workers",
            "hold_lock",
            lock_url,
            name,
            str(ttl),
            str(ready),
        ],
        cwd=ROOT,
    )
    deadline = time.time() + 30
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, "holder did not take the lock"
        time.sleep(0.02)
    return proc


def test_lock_excludes_other_processes(lock_url, tmp_path):
    counter = tmp_path / "counter.json"
    start = time.time() + 1.5
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_workers.count_under_lock, args=(lock_url, str(counter), 10, start))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert json.loads(counter.read_text()) == 40


def test_timeout_names_the_lock_and_its_holder(lock_url, tmp_path):
    holder = _start_holder(lock_url, "tune/ag_gemm", 30, tmp_path)
    try:
        with (
            pytest.raises(LockTimeout) as info,
            lock("tune/ag_gemm", timeout=0.3, backend=backend_from_url(lock_url)),
        ):
            pass
        message = str(info.value)
        assert "tune/ag_gemm" in message and f"pid {holder.pid}" in message and "since" in message
    finally:
        holder.kill()
        holder.wait()


def test_waiters_log_who_holds_the_lock(lock_url, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(registry.locks, "WAIT_LOG_INTERVAL", 0.1)
    holder = _start_holder(lock_url, "busy", 30, tmp_path)
    try:
        with (
            caplog.at_level(logging.INFO, logger="registry.locks"),
            pytest.raises(LockTimeout),
            lock("busy", timeout=0.5, backend=backend_from_url(lock_url)),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    waits = [r.getMessage() for r in caplog.records if "waiting for lock busy" in r.getMessage()]
    assert waits and f"pid {holder.pid}" in waits[0]


def test_a_killed_holder_is_taken_over_within_the_ttl(lock_url, tmp_path):
    ttl = 2.0
    holder = _start_holder(lock_url, "crashy", ttl, tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    with lock("crashy", ttl=ttl, timeout=ttl * 5, backend=backend_from_url(lock_url)) as me:
        assert me is not None and me.pid == os.getpid()
    assert time.monotonic() - started < ttl * 2


def test_a_frozen_holder_keeps_the_lock_until_the_ttl_then_loses_it(lock_url, tmp_path):
    ttl = 2.0
    holder = _start_holder(lock_url, "frozen", ttl, tmp_path)
    holder.send_signal(signal.SIGSTOP)  # alive but silent: no heartbeat
    try:
        backend = backend_from_url(lock_url)
        with pytest.raises(LockTimeout), lock("frozen", ttl=ttl, timeout=ttl / 4, backend=backend):
            pass
        started = time.monotonic()
        with lock("frozen", ttl=ttl, timeout=ttl * 6, backend=backend):
            waited = time.monotonic() - started
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    assert waited >= ttl * 0.5 and waited < ttl * 5


def test_a_live_holder_renews_past_its_ttl(lock_url):
    backend = backend_from_url(lock_url)
    with lock("long", ttl=1.0, timeout=1, backend=backend):
        time.sleep(2.0)  # twice the ttl: the heartbeat must have renewed it
        other = backend_from_url(lock_url)
        with pytest.raises(LockTimeout), lock("long", ttl=1.0, timeout=0.5, backend=other):
            pass
    with lock("long", ttl=1.0, timeout=1, backend=backend):
        pass  # released: free again


def test_bad_arguments_are_named(tmp_path):
    with (
        pytest.raises(RegistryError, match="ttl"),
        lock("x", ttl=0, backend=backend_from_url(str(tmp_path))),
    ):
        pass
    with pytest.raises(RegistryError, match="empty"):
        lock_file_name("")


def test_lock_file_names_are_safe_and_distinct():
    a, b = lock_file_name("ag_gemm/a b"), lock_file_name("ag_gemm/a_b")
    assert a != b and "/" not in a and " " not in a


def test_a_waiter_with_another_ttl_contends_on_the_holders_terms(lock_url, tmp_path):
    holder = _start_holder(lock_url, "mixed-ttl", 1.5, tmp_path)
    holder.send_signal(signal.SIGSTOP)
    try:
        with lock("mixed-ttl", ttl=60, timeout=10, backend=backend_from_url(lock_url)) as me:
            assert me.pid == os.getpid()
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_a_redis_password_is_never_shown():
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    backend = backend_from_url(url)
    with pytest.raises(RegistryError) as info, lock("x", timeout=0, backend=backend):
        pass
    assert "s3cret" not in str(info.value) and "s3cret" not in backend.describe()
    assert ":***@127.0.0.1" in str(info.value)


@pytest.mark.parametrize("squatter", ["hash", "string"])
def test_a_key_without_an_expiry_does_not_block_the_lock_for_ever(redis_url, squatter, caplog):
    # Every lock sets an expiry; a key without one (set by hand, or a wrong type) would
    # never end: it is deleted, with a warning, and the lock taken.
    backend = backend_from_url(redis_url)
    key = "triton-warmup:lock:squatted"
    backend.client.delete(key)
    if squatter == "hash":
        backend.client.hset(key, "a", "b")
    else:
        backend.client.set(key, "not a holder")
    with (
        caplog.at_level(logging.WARNING, logger="registry.locks"),
        lock("squatted", ttl=2, timeout=2, backend=backend),
    ):
        assert backend.client.pttl(key) > 0  # ours now, with its expiry
    assert any("without an expiry" in r.getMessage() for r in caplog.records)


def test_a_foreign_key_with_an_expiry_is_waited_for_like_a_holder(redis_url):
    backend = backend_from_url(redis_url)
    key = "triton-warmup:lock:leased"
    backend.client.hset(key, "a", "b")
    backend.client.pexpire(key, 60_000)
    with pytest.raises(LockTimeout), lock("leased", ttl=2, timeout=0.3, backend=backend):
        pass
    assert backend.client.type(key) == b"hash"  # left alone: it ends by itself
    backend.client.delete(key)


# ---- a holder that lost its key learns it; every call has a deadline --------------------


@pytest.mark.parametrize("how", ["deleted", "flushed", "taken"])
def test_a_holder_whose_key_is_gone_or_taken_learns_it_and_stops_renewing(redis_url, how):
    backend = backend_from_url(redis_url)
    with lock("tune/vanish", ttl=1.0, timeout=5, backend=backend) as me:
        assert me.confirm() is None
        if how == "deleted":
            backend.client.delete(PREFIX + "tune/vanish")
        elif how == "flushed":  # a restart that lost every key
            backend.client.flushall()
        else:
            other = Holder("other-pod", 7, "2026-01-01T00:00:00+00:00", "t0k3n")
            backend.client.set(PREFIX + "tune/vanish", other.to_text(), px=60_000)
        assert wait_for(lambda: me.lost, 3.0)  # the heartbeat (every 0.1 s) saw it
        renewals = me.lease.renewals
        time.sleep(0.3)
        assert me.lease.renewals == renewals  # and stopped
        why = me.confirm()
        assert why is not None and ("other-pod" if how == "taken" else "gone") in why


def test_a_holder_about_to_write_sees_a_loss_before_the_next_heartbeat(redis_url):
    backend = backend_from_url(redis_url)
    with lock("tune/between", ttl=60, timeout=5, backend=backend) as me:  # beats every 6 s
        backend.client.delete(PREFIX + "tune/between")
        assert not me.lost
        assert "gone" in (me.confirm() or "") and me.lost


def test_a_lock_value_over_its_limit_is_never_read(redis_url):
    backend = backend_from_url(redis_url)
    backend.client.flushall()
    backend.client.setrange(PREFIX + "big", 32 * 2**20, b"!")
    backend.client.pexpire(PREFIX + "big", 60_000)
    assert backend.holder("big") is None


@pytest.mark.parametrize("kind", ["tcp", "unix", "tls"])
def test_a_trickling_lock_server_is_unreachable_within_the_deadline(tmp_path, kind):
    import redis

    from registry.locks import Lease, LockServerUnreachable
    from registry.locks.redis_lock import IO_TIMEOUT_CAP_S, RedisLockBackend, _extend, io_timeout

    with trickling(kind, tmp_path) as hostile:
        backend = RedisLockBackend(hostile.url)
        unreachable = pytest.raises(LockServerUnreachable)
        with (
            within(1.0 + IO_TIMEOUT_CAP_S + 0.5),
            unreachable,
            lock("x", ttl=2.0, timeout=1.0, backend=backend),
        ):
            pass
        held = backend._client(io_timeout(2.0)).lock(PREFIX + "x", timeout=2.0)
        held.local.token = b"mine"
        lease = Lease("x", 2.0, time.monotonic())
        with within(io_timeout(2.0) + 0.5), pytest.raises(redis.exceptions.RedisError):
            _extend(held, lease)  # one heartbeat
