"""Fixtures of the registry tests that talk to a real redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.registry.test_redis_outage import Proxy, redis  # noqa: F401  (a module fixture)


@pytest.fixture
def server(redis):  # noqa: F811
    redis.client.flushall()
    return redis


@pytest.fixture
def proxy(server) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.close()
