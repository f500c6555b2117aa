"""The remote tier's transport (``registry.remote.transport``) on a fake client: a call
that fails is an outage and then skipped, a WRONGTYPE answer a miss, an answer ends the
outage and tells the publish queue. On a real server through a proxy:
``test_remote_calls``."""

from __future__ import annotations

import logging

import pytest
import redis

from registry.core.errors import RegistryError, Superseded
from registry.remote.calls import RemoteStats, WarnOnce
from registry.remote.tier import RemoteTier
from registry.remote.transport import MIN_BYTES_PER_S, Transport, Unanswered
from tests.registry.remote.test_tier import KEY

URL = "redis://h:6379/0"


class FakeClient:
    """Answers ``value``, or raises ``error`` (a dead server, a WRONGTYPE)."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.asked = 0

    def ask(self) -> str:
        self.asked += 1
        if self.error is not None:
            raise self.error
        return "value"

    def eval(self, *args: object) -> str:  # what the tier's bounded reads send
        return self.ask()


def _transport(client: FakeClient, **options) -> Transport:
    return Transport(URL, RemoteStats(), WarnOnce(), client=client, **options)


def test_a_failed_call_is_an_outage_then_skipped_unless_asked_now(caplog):
    client = FakeClient()
    transport = _transport(client, retry_after_s=600)
    assert transport.call(lambda c: c.ask()) == "value"
    client.error = redis.exceptions.ConnectionError("Connection refused")
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert transport.call(lambda c: c.ask()) is None
        assert transport.call(lambda c: c.ask()) is None  # skipped: not asked
    assert client.asked == 2 and not transport.calls.up
    stats = transport.calls.stats
    assert (stats.errors, stats.skipped) == (1, 1)
    assert "redis at redis://h:6379/0 unreachable (Connection refused)" in caplog.text
    client.error = None
    assert transport.call(lambda c: c.ask(), now=True) == "value"  # inside the skip
    assert transport.calls.up  # an answer ends the outage


def test_a_key_of_another_type_is_a_miss_warned_once_not_an_outage(caplog):
    client = FakeClient()
    client.error = redis.exceptions.ResponseError("WRONGTYPE Operation against a key")
    transport = _transport(client)
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        for _ in range(3):
            assert transport.attempt(lambda c: c.ask(), key="slot") is None
    assert transport.calls.up and transport.calls.stats.errors == 0
    assert [r.getMessage() for r in caplog.records] == [
        "remote tier: slot: not a hash, left alone (WRONGTYPE Operation against a key)"
    ]
    client.error = redis.exceptions.ResponseError("ERR unknown command")
    with pytest.raises(Unanswered):  # any other error is a failed call
        transport.attempt(lambda c: c.ask())
    assert transport.calls.stats.errors == 1


def test_an_answer_tells_on_answer_unless_it_ends_no_outage():
    answers = []
    transport = _transport(FakeClient())
    transport.on_answer = lambda: answers.append(1)
    transport.attempt(lambda c: c.ask(), ends_outage=False)
    assert answers == []
    transport.attempt(lambda c: c.ask())
    assert answers == [1]

    def refused(client):
        raise Superseded("slot field", held=None)

    with pytest.raises(Superseded):  # the server spoke: an answer, passed on as it is
        transport.attempt(refused, passes=(Superseded,))
    assert answers == [1, 1] and transport.calls.stats.errors == 0


def test_a_call_that_moves_bytes_has_longer(monkeypatch):
    transport = _transport(FakeClient(), timeout_s=0.5)
    assert transport.deadline_for(0) == 0.5
    assert transport.deadline_for(2 * MIN_BYTES_PER_S) == 2.5


def test_a_bad_url_is_named_without_its_password():
    with pytest.raises(RegistryError, match="Remote tier URL") as info:
        Transport("redis://:secret@h:port/0", RemoteStats(), WarnOnce())
    assert "secret" not in str(info.value)


def test_a_tier_runs_on_a_transport_given_to_it(make_entry, h200):
    client = FakeClient()
    client.error = redis.exceptions.ConnectionError("Connection refused")
    tier = RemoteTier(URL, transport=_transport(client, retry_after_s=600))
    assert tier.fetch("ag_gemm", KEY, h200) is None
    assert not tier.up and tier.stats.errors == 1  # the transport's stats are the tier's
    assert not tier.publish(make_entry())  # skipped: kept back
    assert tier.unpublished == 1 and client.asked == 1
