"""The local store with the remote tier behind it: which tier answers, what each keeps."""

from __future__ import annotations

import logging

from registry import MatchPolicy, RegistryError, Store, canonical_key
from registry.remote.tier import RemoteTier, slot_name
from registry.remote.tiered import TieredStore
from tests.conftest import gpu_fingerprint

KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}


def _pod(root, url: str) -> TieredStore:
    return TieredStore(Store(root, create=True), RemoteTier(url, timeout_s=0.5, retry_after_s=0.3))


def test_a_local_hit_does_not_ask_the_remote_tier(tmp_path, server, make_entry, h200):
    store = _pod(tmp_path, server.url)
    stored = store.local.put(make_entry())
    assert store.locate("ag_gemm", KEY, h200) == (stored, "local")
    assert store.lookup("ag_gemm", KEY, h200) == stored
    stats = store.remote.stats
    assert (stats.hits, stats.misses, stats.skipped, stats.errors) == (0, 0, 0, 0)


def test_a_remote_hit_is_kept_in_the_local_store(tmp_path, server, make_entry, h200):
    entry = make_entry()
    _pod(tmp_path / "a", server.url).put(entry)
    other = _pod(tmp_path / "b", server.url)
    assert other.locate("ag_gemm", KEY, h200) == (entry, "remote")
    assert other.entries() == [entry]
    assert other.locate("ag_gemm", KEY, h200) == (entry, "local")  # asked once
    assert other.remote.stats.hits == 1
    assert other.locate("ag_gemm", {**KEY, "M": 8}, h200) is None
    assert other.remote.stats.misses == 1


def test_a_forgiven_remote_match_is_kept_under_its_own_fingerprint(
    tmp_path, server, make_entry, h200
):
    h100 = gpu_fingerprint("NVIDIA H100", sms=114)
    _pod(tmp_path / "a", server.url).put(make_entry(fp=h100))
    other = _pod(tmp_path / "b", server.url)
    assert other.lookup("ag_gemm", KEY, h200) is None
    found, tier = other.locate("ag_gemm", KEY, h200, MatchPolicy.SAME_ARCH)
    assert tier == "remote" and found.fingerprint == h100
    assert other.local.lookup("ag_gemm", KEY, h100) == found


def test_put_publishes_what_the_local_store_merged(tmp_path, server, make_entry, h200):
    store = _pod(tmp_path, server.url)
    first = make_entry(block_m=128, created="2026-01-01T00:00:00+00:00")
    store.local.put(first)  # tuned before the remote tier was there
    later = make_entry(block_m=256, created="2026-01-02T00:00:00+00:00")
    stored = store.put(later)
    assert stored == first.merge(later)
    fetched = RemoteTier(server.url).fetch("ag_gemm", KEY, h200)
    assert fetched == stored and fetched.best == first.best


def test_with_the_remote_tier_down_put_stores_locally(tmp_path, proxy, make_entry, h200, caplog):
    store = _pod(tmp_path, proxy.url)
    proxy.down()
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        stored = store.put(make_entry())
        assert store.locate("ag_gemm", KEY, h200) == (stored, "local")
        assert store.locate("ag_gemm", {**KEY, "M": 8}, h200) is None
    assert store.remote.stats.errors == 1 and store.remote.stats.skipped == 1
    assert len(caplog.records) == 1
    assert Store(tmp_path).entries() == [stored]


def test_a_local_store_that_cannot_be_written_still_returns_the_remote_entry(
    tmp_path, server, make_entry, h200, monkeypatch, caplog
):
    entry = make_entry()
    RemoteTier(server.url).publish(entry)
    store = _pod(tmp_path, server.url)

    def read_only(self, entry):  # chmod stops no writes as root: fail as a read-only volume
        raise RegistryError(f"Store {self.root}: read-only file system")

    monkeypatch.setattr(Store, "put", read_only)
    with caplog.at_level(logging.WARNING, logger="registry.remote.tiered"):
        assert store.locate("ag_gemm", KEY, h200) == (entry, "remote")
    assert "not kept in the local store" in caplog.text and "read-only" in caplog.text
    assert Store(tmp_path).entries() == []


def test_without_a_remote_tier_it_is_the_local_store(tmp_path, make_entry, h200):
    store = TieredStore(Store(tmp_path, lock_timeout=7))
    assert store.lock_timeout == 7 and store.lookup("ag_gemm", KEY, h200) is None
    stored = store.put(make_entry())
    assert store.locate("ag_gemm", KEY, h200) == (stored, "local")
    assert store.entries() == [stored]


def test_a_key_in_another_order_finds_the_same_remote_slot(tmp_path, server, make_entry, h200):
    entry = make_entry()
    RemoteTier(server.url).publish(entry)
    reordered = dict(reversed(list(KEY.items())))
    assert slot_name("ag_gemm", canonical_key(reordered)) == slot_name("ag_gemm", entry.key_json)
    assert _pod(tmp_path, server.url).locate("ag_gemm", reordered, h200) == (entry, "remote")


def test_a_remote_entry_the_caller_refuses_is_not_kept_and_its_fence_holds(
    tmp_path, server, make_entry, h200
):
    from registry.remote.tiered import TieredFence

    theirs = make_entry(block_m=64)
    _pod(tmp_path / "a", server.url).put(theirs)
    mine = _pod(tmp_path / "b", server.url)
    fence = mine.fence("ag_gemm", KEY, h200)
    assert mine.locate("ag_gemm", KEY, h200, keep=lambda e: False) == (theirs, "remote")
    assert mine.entries() == []  # not filed: the fenced put below is not refused
    mine.local.put(make_entry(block_m=32), fence=fence.local)
    assert isinstance(fence, TieredFence)
