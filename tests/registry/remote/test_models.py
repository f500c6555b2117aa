"""Compiled models on the remote tier (a real redis-server): published by one pod,
fetched by a pod with another volume, nothing untrusted written, outages survived."""

from __future__ import annotations

import hashlib
import json
import stat
import time
import tracemalloc

import pytest

from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from registry.remote import blobs, transport
from registry.remote import models as remote_models
from registry.remote.blobs import BLOB_PREFIX
from registry.remote.tier import RemoteTier
from tests._trust import UNSIGNED_OK
from tests.conftest import gpu_fingerprint
from tests.registry._trickle import throttled, trickling, within
from tests.registry.families.test_bundle_indexed import FILES, family, restored

FP = cpu_fingerprint()
KEY = "0123456789abcdef"
WHERE = {"model": "mlp", "key_digest": KEY, "fingerprint": FP}


def tier(url: str) -> RemoteTier:
    return RemoteTier(url, timeout_s=0.5, retry_after_s=30.0, trust=UNSIGNED_OK)


@pytest.fixture
def published(tmp_path, server):
    source = family(tmp_path / "a")
    inductor_cache.blob_path(source, hashlib.sha256(FILES["ab/cabc.so"]).hexdigest()).chmod(0o755)
    assert remote_models.publish(tier(server.url), source, **WHERE)
    return source


def test_a_model_published_by_one_pod_is_fetched_into_another_volume(tmp_path, server, published):
    mine = tier(server.url)
    target = tmp_path / "b"
    assert remote_models.fetch(mine, target, **WHERE)
    assert restored(target, tmp_path / "cache") == FILES
    assert stat.S_IMODE((tmp_path / "cache" / "ab/cabc.so").stat().st_mode) == 0o755
    assert (mine.stats.hits, mine.stats.misses) == (1, 0)


def test_no_unsigned_code_is_published_where_pods_refuse_it(tmp_path, server, caplog):
    """No trusted key, no opt-out, no signing key: every pod like this one refuses an
    unsigned index, so none is sent (one warning says how to share them)."""
    from registry.trust.signing import Trust

    server.client.flushall()
    source = family(tmp_path / "a")
    assert not remote_models.publish(
        RemoteTier(server.url, timeout_s=0.5, trust=Trust()), source, **WHERE
    )
    assert not server.client.keys("triton-warmup:*")
    assert "publishing no code" in caplog.text and "TRITON_WARMUP_SIGNING_KEY" in caplog.text
    assert remote_models.publish(tier(server.url), source, **WHERE)  # the opt-out: sent


def test_nothing_there_is_a_counted_miss(tmp_path, server):
    mine = tier(server.url)
    assert not remote_models.fetch(mine, tmp_path / "b", **WHERE)
    assert not remote_models.fetch(
        mine, tmp_path / "b", **{**WHERE, "fingerprint": gpu_fingerprint()}
    )
    assert mine.stats.misses == 2 and not (tmp_path / "b").exists()


def test_a_blob_the_server_holds_is_not_sent_again(tmp_path, server, published):
    sha = hashlib.sha256(FILES["ab/cabc.so"]).hexdigest()
    server.client.set(remote_models.blob_key(sha), b"left alone")
    assert remote_models.publish(tier(server.url), published, **WHERE)
    assert server.client.get(remote_models.blob_key(sha)) == b"left alone"


def test_a_blob_that_is_not_its_bytes_or_gone_fetches_no_index(tmp_path, server, published):
    blobs = sorted(server.client.keys(BLOB_PREFIX + "*"))
    server.client.set(blobs[0], b"rot")
    target = tmp_path / "b"
    assert not remote_models.fetch(tier(server.url), target, **WHERE)
    server.client.delete(blobs[0])
    assert not remote_models.fetch(tier(server.url), target, **WHERE)
    assert not list(target.glob("models/*/*/*/*.json"))


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda index: index.update(model="other"), "another model"),
        (lambda index: index["files"].update({"../x": index["files"]["ab/cabc.so"]}), "plain"),
        (lambda index: index.update(format=99), "format"),
    ],
)
def test_an_index_that_is_not_this_models_is_skipped(
    tmp_path, server, published, edit, expected, caplog
):
    name = remote_models.index_key("mlp", KEY, FP)
    index = json.loads(server.client.get(name))
    edit(index)
    server.client.set(name, json.dumps(index))
    assert not remote_models.fetch(tier(server.url), tmp_path / "b", **WHERE)
    assert expected in caplog.text and not (tmp_path / "b").exists()


def test_a_damaged_local_blob_is_not_published(tmp_path, server):
    source = family(tmp_path / "a")
    next(p for p in (source / "blobs").rglob("*") if p.is_file()).write_bytes(b"rot")
    assert not remote_models.publish(tier(server.url), source, **WHERE)
    assert server.client.get(remote_models.index_key("mlp", KEY, FP)) is None


def test_an_outage_costs_a_compile_not_the_run(tmp_path, proxy, caplog):
    source = family(tmp_path / "a")
    mine = tier(proxy.url)
    proxy.down()
    assert not remote_models.publish(mine, source, **WHERE)
    assert not remote_models.fetch(mine, tmp_path / "b", **WHERE)
    assert mine.stats.errors == 2 and "unreachable" in caplog.text
    proxy.up()
    assert remote_models.publish(mine, source, **WHERE)  # asked at once: no skip to wait out
    assert remote_models.fetch(tier(proxy.url), tmp_path / "b", **WHERE)


def test_modes_from_the_server_keep_only_the_executable_bits(tmp_path, server, published):
    name = remote_models.index_key("mlp", KEY, FP)
    index = json.loads(server.client.get(name))
    index["modes"] = {sha: 0o777 if i else "rwx" for i, sha in enumerate(index["modes"])}
    server.client.set(name, json.dumps(index))
    target = tmp_path / "b"
    assert remote_models.fetch(tier(server.url), target, **WHERE)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (target / "blobs").rglob("*") if p.is_file()}
    assert modes <= {0o644, 0o755}


def test_an_index_heavy_in_json_values_is_skipped_before_it_is_parsed(tmp_path, server, caplog):
    name = remote_models.index_key("mlp", KEY, FP)
    server.client.set(name, b"[" + b"{}," * 600_000 + b"{}]")
    assert not remote_models.fetch(tier(server.url), tmp_path / "b", **WHERE)
    assert "JSON values" in caplog.text


def test_a_blob_held_at_another_size_is_never_read(tmp_path, server, published, caplog):
    sha = hashlib.sha256(FILES["ab/cabc.so"]).hexdigest()
    server.client.set(remote_models.blob_key(sha), b"x" * 10_000)
    assert not remote_models.fetch(tier(server.url), tmp_path / "b", **WHERE)
    assert "holds otherwise" in caplog.text


def test_another_type_at_the_index_name_is_a_miss_not_an_outage(tmp_path, server):
    server.client.hset(remote_models.index_key("mlp", KEY, FP), "x", "y")
    mine = tier(server.url)
    assert not remote_models.fetch(mine, tmp_path / "b", **WHERE)
    assert mine.stats.errors == 0 and mine.up


def test_a_volume_that_fails_under_publish_costs_the_publish_only(tmp_path, server, caplog):
    source = family(tmp_path / "a")
    blob = next(p for p in (source / "blobs").rglob("*") if p.is_file())
    blob.unlink()
    blob.mkdir()  # a folder in its place: reading it fails
    assert not remote_models.publish(tier(server.url), source, **WHERE)
    assert "not published" in caplog.text


# ---- values bounded before they are read, calls bounded by their deadline ---------------


def _peak(fn):
    tracemalloc.start()
    try:
        answer = fn()
        return answer, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_index_over_its_limit_is_never_read(tmp_path, server, caplog):
    name = remote_models.index_key("mlp", KEY, FP)
    server.client.setrange(name, 100 * 2**20 - 1, b"}")  # 100 MiB on the server
    mine = tier(server.url)
    fetched, peak = _peak(lambda: remote_models.fetch(mine, tmp_path / "b", **WHERE))
    assert not fetched and peak < 4 * 2**20, peak
    assert mine.stats.misses == 1 and not (tmp_path / "b").exists()
    assert f"{name} skipped: {100 * 2**20} bytes; limit {remote_models.MAX_VALUE_BYTES}" in (
        caplog.text
    )
    found, peak = _peak(
        lambda: remote_models.stored_fingerprints(mine, "mlp", KEY, gpu_fingerprint())
    )
    assert found == [] and peak < 4 * 2**20, peak


def test_a_blob_grown_past_its_size_is_never_read(tmp_path, server, published):
    sha = hashlib.sha256(FILES["ab/cabc.so"]).hexdigest()
    server.client.setrange(remote_models.blob_key(sha), 64 * 2**20, b"!")
    fetched, peak = _peak(lambda: remote_models.fetch(tier(server.url), tmp_path / "b", **WHERE))
    assert not fetched and peak < 4 * 2**20, peak


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_trickling_server_is_a_miss_within_the_deadline(tmp_path, kind, published):
    with trickling(kind, tmp_path) as hostile:
        mine = RemoteTier(hostile.url, timeout_s=1.0, trust=UNSIGNED_OK)
        with within(1.5):
            assert not remote_models.fetch(mine, tmp_path / "b", **WHERE)
        with within(1.5):
            assert not remote_models.publish(mine, published, **WHERE)
        with within(1.5):
            assert remote_models.stored_fingerprints(mine, "mlp", KEY, FP) is None


# ---- a blob over one chunk: streamed into a temp file, hashed as it comes ----------------

BIG = {**FILES, "fxgraph/big/entry": bytes(range(256)) * 4100}  # ~1 MiB: 4 chunks of 256 KiB
BIG_SHA = hashlib.sha256(BIG["fxgraph/big/entry"]).hexdigest()


def roomy(url: str) -> RemoteTier:
    """A tier whose calls have time on a loaded machine (these tests are not of deadlines)."""
    return RemoteTier(url, timeout_s=5.0, retry_after_s=30.0, trust=UNSIGNED_OK)


@pytest.fixture
def big(tmp_path, server, monkeypatch):
    monkeypatch.setattr(blobs, "CHUNK_BYTES", 256 * 2**10)
    source = family(tmp_path / "a", BIG)
    assert remote_models.publish(roomy(server.url), source, **WHERE)
    return source


def test_a_model_with_a_blob_over_a_chunk_is_fetched_whole(tmp_path, server, big):
    assert server.client.get(blobs.blob_key(BIG_SHA)) == BIG["fxgraph/big/entry"]  # one value
    assert not server.client.keys(f"{blobs.UPLOAD_PREFIX}*")
    assert remote_models.fetch(roomy(server.url), tmp_path / "b", **WHERE)
    assert restored(tmp_path / "b", tmp_path / "cache") == BIG


def test_a_large_blob_not_its_bytes_leaves_no_file(tmp_path, server, big, caplog):
    size = len(BIG["fxgraph/big/entry"])
    server.client.set(blobs.blob_key(BIG_SHA), b"\0" * size)  # its size, other bytes
    target = tmp_path / "b"
    mine = roomy(server.url)
    assert not remote_models.fetch(mine, target, **WHERE)
    assert "not the bytes of its name" in caplog.text and mine.stats.errors == 0
    assert not list(target.glob("models/*/*/*/*.json"))  # no index
    assert not inductor_cache.blob_path(target, BIG_SHA).exists()
    assert not list((target / "blobs").rglob(".tmp-*"))  # the temp file went too


def test_a_volume_that_fails_under_a_streamed_fetch_is_a_miss_not_an_outage(
    tmp_path, server, big, caplog
):
    target = tmp_path / "b"
    folder = inductor_cache.blob_path(target, BIG_SHA).parent
    folder.parent.mkdir(parents=True)
    folder.write_bytes(b"a file where the blob's folder goes")
    mine = roomy(server.url)
    assert not remote_models.fetch(mine, target, **WHERE)
    assert "not written here" in caplog.text and mine.stats.errors == 0 and mine.up


def test_a_slow_server_is_cut_at_the_blobs_deadline_and_leaves_no_file(
    tmp_path, server, big, monkeypatch
):
    monkeypatch.setattr(transport, "MIN_BYTES_PER_S", 2**20)  # the blob: 0.5 s + ~1 s
    target = tmp_path / "b"
    with throttled(server.port, down_bytes_per_s=2**19) as url:  # half the rate: ~2 s
        mine = tier(url)
        started = time.monotonic()
        assert not remote_models.fetch(mine, target, **WHERE)
        took = time.monotonic() - started
    deadline = mine.deadline_for(len(BIG["fxgraph/big/entry"]))
    assert deadline - 0.1 < took <= deadline + 0.5 + 0.5, took  # + the index's call
    assert mine.stats.errors == 1 and not mine.up
    assert not inductor_cache.blob_path(target, BIG_SHA).exists()
    assert not list(target.rglob(".tmp-*"))
