"""A redis URL read in one place: what names a server, how it is shown, its client."""

import os
import sys
import time
import tracemalloc

import pytest

from registry.core import redis_url
from registry.core.fingerprint import cpu_fingerprint
from tests.registry._trickle import GARBAGE, SLOW_BULK, throttled, trickling, within
from warmup.core.services import Services


def test_only_redis_schemes_name_a_server():
    for url in ("redis://cache:6379/0", "rediss://cache:6380/1", "unix:///run/redis.sock"):
        assert redis_url.is_redis(url)
    for url in ("", "off", "/volume/locks", "file:///volume/locks", "http://cache"):
        assert not redis_url.is_redis(url)


def test_a_password_is_never_shown():
    assert redis_url.redacted("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert redis_url.redacted("redis://me:s3cret@cache/0") == "redis://me:***@cache/0"
    assert redis_url.redacted("redis://cache:6379/0") == "redis://cache:6379/0"


def test_a_client_waits_its_timeout_and_never_retries():
    client = redis_url.client("redis://127.0.0.1:1/0", timeout_s=0.25)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.25
    assert kwargs["retry"].get_retries() == 0
    with pytest.raises(ValueError):
        redis_url.client("http://cache", timeout_s=1.0)


def test_each_user_of_redis_says_it_needs_redis_py_when_it_is_missing(monkeypatch):
    from registry import RegistryError
    from registry.locks.redis_lock import RedisLockBackend
    from registry.remote.tier import RemoteTier

    for module in ("redis", "redis.backoff", "redis.retry"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails: not installed
    for make, user in ((RedisLockBackend, "redis lock backend"), (RemoteTier, "remote tier")):
        with pytest.raises(RegistryError, match=f"The {user} needs redis-py: pip install"):
            make("redis://cache:6379/0")


# ---- a deadline for the whole call ------------------------------------------------------

KINDS = ("tcp", "unix", "tls-handshake", "tls")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("payload", [SLOW_BULK, GARBAGE], ids=["resp", "garbage"])
def test_a_server_that_trickles_its_answer_is_cut_at_the_deadline(tmp_path, kind, payload):
    import redis

    with trickling(kind, tmp_path, payload) as server:
        client = redis_url.client(server.url, timeout_s=1.0)
        with within(1.5), pytest.raises(redis.exceptions.RedisError):
            client.get("k")  # one command: its own deadline
        failed = pytest.raises(redis.exceptions.RedisError)
        with within(1.5), failed, redis_url.deadline(1.0), client.pipeline() as pipe:
            pipe.watch("k")  # several commands: one deadline
            pipe.get("k")
            pipe.multi()
            pipe.set("k", b"v")
            pipe.execute()
        with within(1.5), pytest.raises(redis.exceptions.RedisError), redis_url.deadline(1.0):
            list(client.scan_iter(match="*", count=10))


def test_a_connection_cut_at_its_deadline_is_never_reused(tmp_path):
    import redis

    with trickling("tcp", tmp_path) as server:
        client = redis_url.client(server.url, timeout_s=0.5)
        with pytest.raises(redis.exceptions.TimeoutError):
            client.get("k")
        pool = client.connection_pool
        idle = list(pool._available_connections)
        assert idle and all(c._sock is None for c in idle)  # closed: no half-read answer


def test_an_inner_deadline_never_outlasts_the_outer_one():
    with redis_url.deadline(0.2) as outer, redis_url.deadline(10.0):
        assert redis_url.time_left() <= 0.2
        time.sleep(0.25)
        with pytest.raises(TimeoutError):
            redis_url.time_left()
    assert outer > 0 and redis_url.time_left() == float("inf")


def test_a_value_is_read_only_within_its_limit(server):
    c = redis_url.client(server.url, timeout_s=1.0)
    c.set("small", b"hello")
    c.setrange("big", 32 * 2**20 - 1, b"x")  # 32 MiB on the server, a few bytes sent
    c.hset("slot", mapping={"a": b"x" * 10, "b": b"y" * 100, "c": b"z" * 10})
    assert redis_url.answer(redis_url.get(c, "small", 5)) == b"hello"
    assert redis_url.answer(redis_url.get(c, "big", 2**20)) == redis_url.Oversized(32 * 2**20)
    assert redis_url.answer(redis_url.get(c, "none", 5)) is None
    assert redis_url.answer(redis_url.hget(c, "slot", "b", 50)) == redis_url.Oversized(100)
    assert redis_url.answer(redis_url.hget(c, "slot", "a", 50)) == b"x" * 10
    read = redis_url.fields(redis_url.hgetall(c, "slot", limit=50, budget=15, most=10))
    assert len(read.values) == 1 and read.skipped == 2 and read.oversized[b"b"] == 100
    tracemalloc.start()
    try:
        redis_url.get(c, "big", 2**20)
        assert tracemalloc.get_traced_memory()[1] < 2**20  # the 32 MiB never came
    finally:
        tracemalloc.stop()


# ---- the password --------------------------------------------------------------------------


def test_a_password_from_settings_is_used_where_the_url_has_none(server, monkeypatch, tmp_path):
    import redis

    from tests.conftest import settings_for

    admin = redis_url.client(server.url, timeout_s=1.0)
    admin.config_set("requirepass", "s3cret")
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis_url.client(server.url, timeout_s=1.0).ping()
        assert redis_url.client(server.url, timeout_s=1.0, password="s3cret").ping()
        with_own = server.url.replace("redis://", "redis://:s3cret@")
        assert redis_url.client(with_own, timeout_s=1.0, password="wrong").ping()  # the URL's
        monkeypatch.setenv("TRITON_WARMUP_REDIS_PASSWORD", "s3cret")
        settings = settings_for(tmp_path, lock_url=server.url, remote_url=server.url)
        assert "s3cret" not in repr(settings) and "s3cret" not in str(settings.model_dump())
        services = Services(settings)
        tier = services.remote
        assert tier is not None and tier.fetch("k", {"M": 1}, cpu_fingerprint()) is None
        assert tier.stats.errors == 0
        services.locks.ping()  # type: ignore[attr-defined]
    finally:
        client = redis_url.client(server.url, timeout_s=1.0, password="s3cret")
        client.config_set("requirepass", "")


def test_a_callers_longer_deadline_governs_the_whole_call(server):
    """A call that moves a blob is given longer than one command's timeout: inside the
    caller's deadline a steady transfer that outlasts ``timeout_s`` completes."""
    import redis

    value = os.urandom(2 * 2**20)
    redis_url.client(server.url, timeout_s=1.0).set("blob", value)
    with throttled(server.port, down_bytes_per_s=6 * 2**20) as url:  # the value: ~0.3 s
        c = redis_url.client(url, timeout_s=0.1)
        with pytest.raises(redis.exceptions.TimeoutError):
            c.get("blob")
        with redis_url.deadline(3.0):
            assert c.get("blob") == value
            with c.pipeline(transaction=False) as pipe:
                pipe.get("blob")
                assert pipe.execute() == [value]


def test_each_wait_gets_what_is_left_of_the_call_not_one_timeout(server):
    """A busy server, slow to start each answer (0.3 s) but within the call's deadline,
    is waited for: a wait on the socket is not cut at ``timeout_s`` (0.1 s)."""
    import redis

    redis_url.client(server.url, timeout_s=1.0).set("k", b"v")
    with throttled(server.port, stall_s=0.3) as url:
        c = redis_url.client(url, timeout_s=0.1)
        with within(0.6), pytest.raises(redis.exceptions.TimeoutError):
            c.get("k")  # one command: its own deadline, 0.1 s
        started = time.monotonic()
        with redis_url.deadline(3.0):
            assert [c.get("k") for _ in range(3)] == [b"v"] * 3
        assert time.monotonic() - started >= 0.9


def test_a_watch_whose_deadline_passed_closes_its_connection_and_returns_it(server):
    """Leaving a WATCH after the call's deadline passed never waits on UNWATCH, never
    hides the error, and gives the connection back (closed: no half-read answer)."""
    import redis

    c = redis_url.client(server.url, timeout_s=0.5)
    pool = c.connection_pool
    # WatchError: redis-py's word for an error under WATCH
    with (
        pytest.raises(redis.exceptions.RedisError),
        redis_url.deadline(0.2),
        c.pipeline() as pipe,
    ):
        pipe.watch("k")
        pipe.blpop(["nothing"], timeout=1)  # immediate under WATCH: cut at 0.2 s
    assert not pool._in_use_connections  # returned
    assert c.ping()
