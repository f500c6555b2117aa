"""Triton's compile cache on the remote tier (a real redis-server): files stored once by
content, read back whole or not at all, nothing raised when redis is down or stalls."""

from __future__ import annotations

import hashlib
import time
import tracemalloc

import pytest

from registry.remote import blobs
from registry.remote import triton as remote_triton
from registry.remote.blobs import blob_key
from registry.remote.tier import RemoteTier
from tests._trust import UNSIGNED_OK
from tests.registry._trickle import trickling, within

KEY = "CZ4VKGKEWFV6MYQ5X5TRDJHUJU3GNRTX4GLYL7SUUERN3NQAXEGA"
CUBIN = b"\x7fELF" + bytes(range(256)) * 40


def tier(url: str, timeout_s: float = 0.5) -> RemoteTier:
    return RemoteTier(url, timeout_s=timeout_s, retry_after_s=30.0, trust=UNSIGNED_OK)


def test_a_file_published_by_one_pod_is_fetched_by_another(server):
    assert remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    assert remote_triton.fetch(tier(server.url), KEY, ["k.cubin", "k.json"]) == {"k.cubin": CUBIN}


def test_a_file_over_a_chunk_moves_in_chunks_stored_once(server, monkeypatch):
    monkeypatch.setattr(blobs, "CHUNK_BYTES", 64 * 2**10)
    big = CUBIN * 30  # ~300 KiB: 5 chunks
    pods = [tier(server.url, timeout_s=5.0) for _ in range(2)]  # a loaded machine: no outage
    assert all(remote_triton.publish(pod, KEY, "big.cubin", big) for pod in pods)
    assert sum(pod.stats.published for pod in pods) == 1  # the second found it there
    assert server.client.get(blob_key(_sha(big))) == big  # one value, as older pods read
    assert remote_triton.fetch(pods[0], KEY, ["big.cubin"]) == {"big.cubin": big}
    server.client.set(blob_key(_sha(big)), b"\0" * len(big))
    assert remote_triton.fetch(pods[0], KEY, ["big.cubin"]) == {}


def test_n_pods_publishing_the_same_kernel_store_its_bytes_once(server):
    pods = [tier(server.url) for _ in range(4)]
    for pod in pods:
        assert remote_triton.publish(pod, KEY, "k.cubin", CUBIN)
        assert remote_triton.publish(pod, "OTHERKEY", "k.cubin", CUBIN)
    assert server.client.keys("triton-warmup:blob:*") == [blob_key(_sha(CUBIN)).encode()]
    assert sum(pod.stats.published for pod in pods) == 1
    assert len(server.client.keys(f"{remote_triton.NAME_PREFIX}*")) == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda c: c.set(blob_key(_sha(CUBIN)), CUBIN[:-1] + b"!"),  # flipped byte
        lambda c: c.set(blob_key(_sha(CUBIN)), CUBIN[:100]),  # cut short
        lambda c: c.delete(blob_key(_sha(CUBIN))),  # evicted
        lambda c: c.set(remote_triton.name_key(KEY, "k.cubin"), b"not a pointer"),
        lambda c: c.set(remote_triton.name_key(KEY, "k.cubin"), f"{'0' * 64} 10".encode()),
    ],
    ids=["flipped", "short", "evicted", "garbled-name", "dangling-name"],
)
def test_a_damaged_or_missing_file_is_a_miss_and_the_next_publish_repairs_it(server, damage):
    assert remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    damage(server.client)
    assert remote_triton.fetch(tier(server.url), KEY, ["k.cubin"]) == {}
    server.client.delete(blob_key(_sha(CUBIN)))
    assert remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    assert remote_triton.fetch(tier(server.url), KEY, ["k.cubin"]) == {"k.cubin": CUBIN}


def test_a_file_over_the_cap_is_refused_and_one_claiming_more_is_never_read(server, monkeypatch):
    monkeypatch.setattr(remote_triton, "MAX_FILE_BYTES", 1000)
    assert not remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    assert server.client.keys("*") == []
    monkeypatch.undo()
    assert remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    monkeypatch.setattr(remote_triton, "MAX_FILE_BYTES", 1000)
    assert remote_triton.fetch(tier(server.url), KEY, ["k.cubin"]) == {}


@pytest.mark.parametrize(
    ("key", "name"),
    [(KEY, "../k.cubin"), (KEY, "a/b"), ("../x", "k.cubin"), ("", "k.cubin"), (KEY, "..")],
)
def test_a_name_that_is_a_path_is_never_published_nor_asked_for(server, key, name):
    assert not remote_triton.publish(tier(server.url), key, name, CUBIN)
    assert server.client.keys("*") == []
    assert remote_triton.fetch(tier(server.url), key, [name]) == {}


def test_redis_down_or_stalled_is_a_quick_miss_and_then_skipped(server, proxy):
    assert remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    for outage in (proxy.down, proxy.stall):
        outage()
        pod = tier(proxy.url, timeout_s=0.2)
        start = time.monotonic()
        assert remote_triton.fetch(pod, KEY, ["k.cubin"]) == {}
        assert not remote_triton.publish(pod, KEY, "k.json", b"{}")
        assert remote_triton.fetch(pod, KEY, ["k.cubin"]) == {}  # skipped: no second wait
        assert time.monotonic() - start < 1.5
        assert pod.stats.errors == 1 and pod.stats.skipped == 2
        proxy.up()


def test_an_outage_between_publishes_keeps_the_first_and_a_retry_stores_once(server, proxy):
    pod = tier(proxy.url)
    assert remote_triton.publish(pod, KEY, "k.cubin", CUBIN)  # acknowledged
    proxy.down()
    assert not remote_triton.publish(pod, KEY, "k.json", b"{}")  # not acknowledged
    proxy.up()
    later = tier(proxy.url)
    assert remote_triton.fetch(later, KEY, ["k.cubin", "k.json"]) == {"k.cubin": CUBIN}
    assert remote_triton.publish(later, KEY, "k.json", b"{}")
    assert remote_triton.publish(later, KEY, "k.json", b"{}")
    assert len(server.client.keys("triton-warmup:blob:*")) == 2


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- values bounded before they are read, calls bounded by their deadline ---------------


def test_a_name_or_blob_over_its_limit_is_never_read(server):
    assert remote_triton.publish(tier(server.url), KEY, "k.cubin", CUBIN)
    server.client.setrange(blob_key(_sha(CUBIN)), 50 * 2**20, b"!")  # grown past its size
    server.client.setrange(remote_triton.name_key(KEY, "k.json"), 50 * 2**20, b"!")
    tracemalloc.start()
    try:
        assert remote_triton.fetch(tier(server.url), KEY, ["k.cubin", "k.json"]) == {}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak


@pytest.mark.parametrize("kind", ["tcp", "unix", "tls"])
def test_a_trickling_server_is_a_miss_within_the_deadline(tmp_path, kind):
    with trickling(kind, tmp_path) as hostile:
        with within(1.5):
            assert remote_triton.fetch(tier(hostile.url, 1.0), KEY, ["k.cubin"]) == {}
        with within(1.5):
            assert not remote_triton.publish(tier(hostile.url, 1.0), KEY, "k.cubin", CUBIN)
