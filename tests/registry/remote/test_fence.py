"""The remote tier's fenced writes (``registry.remote.fence``) on a real redis-server: a
merge under WATCH, an identical value written once, a stale fence refused with the entry
the field holds, a newer version's entry never overwritten."""

from __future__ import annotations

import pytest

from registry.core import atomic
from registry.core.entry import SCHEMA_VERSION
from registry.core.errors import Superseded
from registry.remote.calls import RemoteStats, WarnOnce
from registry.remote.codec import Codec
from registry.remote.fence import Fence
from registry.remote.values import digest, read_field, slot_name
from registry.trust.signing import Trust


def _fence() -> Fence:
    stats = RemoteStats()
    return Fence(Codec(Trust(), stats, WarnOnce()), stats)


def _at(entry) -> tuple[str, str]:
    return slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest()


def test_a_publish_merges_and_an_identical_one_writes_nothing(server, make_entry):
    fence = _fence()
    first = make_entry(block_m=128, created="2026-01-01T00:00:00+00:00")
    later = make_entry(block_m=256, created="2026-01-02T00:00:00+00:00")
    assert fence.publish(server.client, first) and fence.publish(server.client, later)
    assert fence.publish(server.client, later)
    assert fence.stats.published == 2
    held = server.client.hget(*_at(first))
    assert held == atomic.dumps(first.merge(later).to_json()).encode()


def test_a_stale_fence_is_refused_with_the_entry_the_field_holds(server, make_entry):
    fence, entry = _fence(), make_entry()
    seen = digest(read_field(server.client, *_at(entry)))
    assert seen == ""  # nothing there yet
    other = make_entry(block_m=256)
    assert fence.publish(server.client, other, seen)  # the first to publish lands
    with pytest.raises(Superseded) as info:
        fence.publish(server.client, entry, seen)
    assert info.value.held == other and fence.stats.superseded == 1
    now = digest(read_field(server.client, *_at(entry)))
    assert fence.publish(server.client, entry, now)  # a fresh fence merges


def test_a_newer_versions_entry_is_left_alone(server, make_entry, caplog):
    fence, entry = _fence(), make_entry()
    newer = atomic.dumps({**entry.to_json(), "schema": SCHEMA_VERSION + 1}).encode()
    server.client.hset(*_at(entry), newer)
    assert not fence.publish(server.client, entry)
    assert not fence.publish(server.client, entry)
    assert server.client.hget(*_at(entry)) == newer
    assert caplog.text.count("a newer version's entry holds it") == 1


def test_a_value_that_is_no_entry_is_replaced(server, make_entry, caplog):
    fence, entry = _fence(), make_entry()
    server.client.hset(*_at(entry), b"garbage")
    assert fence.publish(server.client, entry)
    assert server.client.hget(*_at(entry)) == atomic.dumps(entry.to_json()).encode()
    assert "replacing a value that is no entry" in caplog.text
