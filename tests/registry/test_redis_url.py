"""A redis URL read in one place: what names a server, how it is shown, its client."""

import sys

import pytest

from registry import redis_url


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
    from registry.remote import RemoteTier

    for module in ("redis", "redis.backoff", "redis.retry"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails: not installed
    for make, user in ((RedisLockBackend, "redis lock backend"), (RemoteTier, "remote tier")):
        with pytest.raises(RegistryError, match=f"The {user} needs redis-py: pip install"):
            make("redis://cache:6379/0")
