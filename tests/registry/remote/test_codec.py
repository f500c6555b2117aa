"""The remote tier's codec (``registry.remote.codec``): an entry is opened only when it is
signed as the trust requires and filed under its own field and slot, each bad value
warned once; what a pod seals opens again. Bounded reads on a real redis-server:
``test_remote_values``."""

from __future__ import annotations

import logging

import pytest

from registry import MatchPolicy
from registry.core import atomic
from registry.core.entry import SCHEMA_VERSION, NewerSchema
from registry.core.errors import RegistryError
from registry.core.redis_url import Oversized
from registry.remote.calls import RemoteStats, WarnOnce
from registry.remote.codec import Codec
from registry.remote.values import slot_name
from registry.storage.store import MAX_ENTRY_BYTES
from registry.trust import signing
from registry.trust.signing import Trust
from tests.conftest import gpu_fingerprint


@pytest.fixture
def fleet(tmp_path) -> Trust:
    """A pod's trust: its own key, trusted, signatures required."""
    private, _ = signing.generate(tmp_path / "keys", "pod")
    return Trust.load(tmp_path / "keys", signing_key=private)


def _codec(trust: Trust | None = None) -> Codec:
    return Codec(trust or Trust(), RemoteStats(), WarnOnce())


def _at(entry) -> tuple[str, str]:
    return slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest()


def test_a_sealed_entry_decodes_at_its_own_field_only(fleet, make_entry, caplog):
    codec, entry = _codec(fleet), make_entry()
    name, field = _at(entry)
    value = codec.sealed(name, field, entry)
    assert value is not None and value != atomic.dumps(entry.to_json()).encode()  # signed
    assert codec.decode(name, field, value) == entry
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        other = gpu_fingerprint("NVIDIA H100", sms=114).digest()
        assert codec.decode(name, other, value) is None  # the signature covers the field
        assert codec.decode(name, other, value) is None
    assert codec.stats.refused == 2 and len(caplog.records) == 1  # counted twice, said once


def test_an_entry_filed_under_another_field_or_slot_is_skipped(make_entry, caplog):
    codec, entry = _codec(), make_entry()
    name, field = _at(entry)
    value = codec.sealed(name, field, entry)
    assert value is not None
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert codec.decode(name, "0" * 64, value) is None
        assert codec.decode(slot_name("ag_gemm", "{}"), field, value) is None
    assert all("filed under another slot" in r.getMessage() for r in caplog.records)
    assert len(caplog.records) == 2 and codec.stats.refused == 0


def test_a_newer_versions_entry_and_garbage_are_skipped_with_one_warning(make_entry, caplog):
    codec, entry = _codec(), make_entry()
    name, field = _at(entry)
    newer = atomic.dumps({**entry.to_json(), "schema": SCHEMA_VERSION + 1}).encode()
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert codec.decode(name, field, newer) is None
        assert codec.decode(name, field, b"garbage") is None  # the same field: said once
    assert len(caplog.records) == 1 and "newer version" in caplog.records[0].getMessage()
    with pytest.raises(NewerSchema):
        codec.stored(name, field, newer)
    with pytest.raises(RegistryError, match="another slot"):
        codec.stored(slot_name("ag_gemm", "{}"), field, atomic.dumps(entry.to_json()).encode())


def test_held_hands_over_a_trusted_entry_or_none_quietly(fleet, make_entry, caplog):
    codec, entry = _codec(fleet), make_entry()
    name, field = _at(entry)
    assert codec.held(name, field, codec.sealed(name, field, entry)) == entry
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert codec.held(name, field, None) is None
        assert codec.held(name, field, Oversized(10**9)) is None
    assert caplog.records == [] and codec.stats.refused == 0  # nothing read, nothing refused


def test_an_entry_over_the_files_limit_is_not_sealed(make_entry, caplog):
    codec = _codec()
    entry = make_entry(host="x" * (MAX_ENTRY_BYTES + 1))
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert codec.sealed(*_at(entry), entry) is None
    assert f"limit {MAX_ENTRY_BYTES}" in caplog.text


def test_a_pod_without_a_key_publishes_nothing_where_signatures_are_required(fleet, caplog):
    assert _codec().may_publish("redis at here")  # no trust configured
    assert _codec(fleet).may_publish("redis at here")
    reader = _codec(Trust(fleet.keys))  # requires signatures, cannot sign
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert not reader.may_publish("redis at here")
        assert not reader.may_publish("redis at here")
    assert len(caplog.records) == 1 and "no signing key" in caplog.text


def test_a_slot_read_on_the_server_picks_as_the_policy_says(server, make_entry, h200):
    codec = _codec()
    h100 = gpu_fingerprint("NVIDIA H100", sms=114)
    entry = make_entry(fp=h100)
    name, field = _at(entry)
    server.client.hset(name, field, codec.sealed(name, field, entry))
    assert codec.entry(server.client, name, h200, MatchPolicy.EXACT) is None
    assert codec.entry(server.client, name, h200, MatchPolicy.SAME_ARCH) == entry
    assert codec.sample(server.client, 10) == [entry]
