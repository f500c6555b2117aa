"""The remote tier on a real redis-server: sharing, merging, matching, bad values and the
entries an outage kept back (through the outage tests' TCP proxy). Its calls' deadlines
and outages: ``test_remote_calls``; the bounds on what is read: ``test_remote_values``."""

from __future__ import annotations

import json
import logging
import time

import pytest

from registry import MatchPolicy, RegistryError
from registry.core import atomic
from registry.core.entry import SCHEMA_VERSION
from registry.remote.tier import RemoteTier, remote_tier, slot_name
from registry.storage.store import MAX_ENTRY_BYTES
from tests.conftest import gpu_fingerprint

KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}
RETRY_S = 0.3


def _slot(entry) -> str:
    return slot_name(entry.kernel, entry.key_json)


def _messages(caplog, level=logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# ---- sharing ---------------------------------------------------------------------------


def test_an_entry_published_by_one_pod_is_fetched_by_another(server, make_entry, h200):
    entry = make_entry()
    assert RemoteTier(server.url).publish(entry)
    other = RemoteTier(server.url)
    assert other.fetch("ag_gemm", KEY, h200) == entry
    assert other.fetch("ag_gemm", {**KEY, "M": 8}, h200) is None
    assert (other.stats.hits, other.stats.misses) == (1, 1)
    name = _slot(entry)
    assert name.startswith("triton-warmup:entry:ag_gemm:") and len(name.split(":")[-1]) == 24
    assert server.client.hkeys(name) == [h200.digest().encode()]


def test_publish_merges_and_an_identical_publish_writes_nothing(server, make_entry, h200):
    tier = RemoteTier(server.url)
    first = make_entry(block_m=128, created="2026-01-01T00:00:00+00:00")
    later = make_entry(block_m=256, created="2026-01-02T00:00:00+00:00")
    assert tier.publish(first) and tier.publish(later)
    merged = tier.fetch("ag_gemm", KEY, h200)
    assert merged == first.merge(later)
    assert merged.best == first.best  # the earliest tuning wins
    assert {m.config.meta.get("BLOCK_M") for m in merged.measurements} == {512, 64, 128, 256}
    assert tier.stats.published == 2
    assert tier.publish(later) and tier.stats.published == 2  # already held: no write
    raw = server.client.hget(_slot(first), h200.digest())
    assert raw == atomic.dumps(merged.to_json()).encode()


def test_the_policy_decides_whether_another_gpu_matches(server, make_entry, h200):
    h100 = gpu_fingerprint("NVIDIA H100", sms=114)
    tier = RemoteTier(server.url)
    tier.publish(make_entry(fp=h100, block_m=32))
    assert tier.fetch("ag_gemm", KEY, h200) is None
    assert tier.fetch("ag_gemm", KEY, h200, MatchPolicy.SAME_ARCH).fingerprint == h100
    a100 = gpu_fingerprint("NVIDIA A100", cc="8.0")
    assert tier.fetch("ag_gemm", KEY, a100, MatchPolicy.SAME_ARCH) is None
    assert tier.fetch("ag_gemm", KEY, a100, MatchPolicy.ANY) is not None
    tier.publish(make_entry(fp=h200, block_m=256))
    found = tier.fetch("ag_gemm", KEY, h200, MatchPolicy.SAME_ARCH)
    assert found.best.meta["BLOCK_M"] == 256  # the exact one before a forgiven one


# ---- values not to trust ---------------------------------------------------------------


def _spoiled(entry, spoil) -> bytes:
    data = entry.to_json()
    spoil(data)
    return json.dumps(data).encode()


BAD_VALUES = {
    "garbage": lambda e: b"\x00\xff garbage",
    "not an object": lambda e: b"[1, 2, 3]",
    "a wrong-typed field": lambda e: _spoiled(e, lambda d: d.update(measurements=5)),
    "oversized": lambda e: b" " * (MAX_ENTRY_BYTES + 1) + atomic.dumps(e.to_json()).encode(),
    "another slot's entry": lambda e: _spoiled(e, lambda d: d["key"].update(M=1)),
}


@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_a_bad_value_is_skipped_with_one_warning(server, make_entry, h200, value, caplog):
    entry = make_entry()
    server.client.hset(_slot(entry), h200.digest(), value(entry))
    tier = RemoteTier(server.url)
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        for policy in (MatchPolicy.EXACT, MatchPolicy.ANY, MatchPolicy.EXACT):
            assert tier.fetch("ag_gemm", KEY, h200, policy) is None
    assert len(_messages(caplog)) == 1  # once per field, not per call
    assert (tier.stats.hits, tier.stats.misses, tier.stats.errors) == (0, 3, 0)
    assert tier.publish(entry)  # a bad value is replaced, as a corrupt file is
    assert tier.fetch("ag_gemm", KEY, h200) == entry


def test_a_newer_versions_entry_is_skipped_and_never_overwritten(server, make_entry, h200, caplog):
    entry = make_entry()
    newer = _spoiled(entry, lambda d: d.update(schema=SCHEMA_VERSION + 1))
    server.client.hset(_slot(entry), h200.digest(), newer)
    tier = RemoteTier(server.url)
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert tier.fetch("ag_gemm", KEY, h200) is None
        assert not tier.publish(entry)
    assert server.client.hget(_slot(entry), h200.digest()) == newer
    assert len(_messages(caplog)) == 1 and "newer version" in _messages(caplog)[0]
    assert tier.stats.errors == 0 and tier.up


def test_a_string_at_a_slots_name_is_a_miss_not_an_outage(server, make_entry, h200, caplog):
    entry = make_entry()
    server.client.set(_slot(entry), "someone else's")
    tier = RemoteTier(server.url)
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert tier.fetch("ag_gemm", KEY, h200) is None
        assert tier.fetch("ag_gemm", KEY, h200, MatchPolicy.ANY) is None
        assert not tier.publish(entry)
    assert server.client.get(_slot(entry)) == b"someone else's"  # left alone
    assert len(_messages(caplog)) == 1 and "not a hash" in _messages(caplog)[0]
    assert tier.stats.errors == 0 and tier.up
    assert tier.publish(make_entry(m=8))  # other slots are written


# ---- entries kept back during an outage ----------------------------------------------


def test_entries_not_published_during_an_outage_are_published_when_it_answers(
    proxy, server, make_entry, h200
):
    tier = RemoteTier(proxy.url, timeout_s=0.5, retry_after_s=RETRY_S)
    proxy.down()
    first = make_entry()
    other = make_entry(8)
    assert not tier.publish(first)  # the call fails
    assert not tier.publish(other)  # skipped
    merged = first.merge(make_entry(block_m=256, created="2026-01-02T00:00:00+00:00"))
    assert not tier.publish(merged)  # the newest of a field replaces the one kept back
    assert tier.unpublished == 2
    proxy.up()
    time.sleep(RETRY_S)
    assert tier.fetch("ag_gemm", {**KEY, "M": 16}, h200) is None  # it answers: published
    assert tier.unpublished == 0
    reader = RemoteTier(server.url)
    assert reader.fetch("ag_gemm", KEY, h200) == merged
    assert reader.fetch("ag_gemm", {**KEY, "M": 8}, h200) == other


def test_flush_publishes_what_was_kept_back_without_waiting_for_the_retry(
    proxy, server, make_entry, h200, caplog
):
    tier = RemoteTier(proxy.url, timeout_s=0.5, retry_after_s=600)
    proxy.down()
    entry = make_entry()
    assert not tier.publish(entry)
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert tier.flush() == 1  # still down: warned, kept
    assert "1 tuned entries not published" in caplog.text
    proxy.up()
    assert not tier.up and tier.flush() == 0  # the end of a run: tried now, published
    assert RemoteTier(server.url).fetch("ag_gemm", KEY, h200) == entry
    assert tier.up
    proxy.down()  # a later outage is warned about again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert tier.fetch("ag_gemm", KEY, h200) is None
    assert "unreachable" in caplog.text


# ---- the URL -----------------------------------------------------------------------


def test_remote_tier_from_a_url():
    assert remote_tier("") is None and remote_tier("off") is None
    for url in ("redis://h:6379/0", "rediss://h/1", "unix:///run/redis.sock"):
        tier = remote_tier(url)
        assert isinstance(tier, RemoteTier) and tier.describe() == f"redis at {url}"
    for url in ("http://h:6379", "h:6379", "redis://:secret@h:port/0"):
        with pytest.raises(RegistryError, match="Remote tier URL") as info:
            remote_tier(url)
        assert "\n" not in str(info.value) and "secret" not in str(info.value)
