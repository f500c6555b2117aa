"""Fixtures of the registry tests: a real redis-server, a store of two entries."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from registry.storage.store import Store
from tests.registry.test_lock_chaos import Server
from tests.registry.test_redis_outage import Proxy, redis  # noqa: F401  (a module fixture)


@pytest.fixture
def server(redis):  # noqa: F811
    redis.client.flushall()
    return redis


@pytest.fixture
def restartable_server(tmp_path) -> Iterator[Server]:
    """A redis-server of the test's own, which the test may kill and restart."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    folder = tmp_path / "redis"
    folder.mkdir()
    s = Server(folder)
    yield s
    s.kill()


@pytest.fixture
def proxy(server) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.close()


@pytest.fixture
def store(tmp_path, make_entry) -> Store:
    """A store of two entries (the command line's tests read, list and bundle it)."""
    store = Store(tmp_path / "reg", create=True)
    store.put_many([make_entry(m=m) for m in (1024, 2048)])
    return store
