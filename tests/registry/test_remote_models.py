"""Compiled models on the remote tier (a real redis-server): published by one pod,
fetched by a pod with another volume, nothing untrusted written, outages survived."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from registry import inductor_cache, remote_models
from registry.fingerprint import cpu_fingerprint
from registry.remote import RemoteTier
from tests.conftest import gpu_fingerprint
from tests.registry.test_bundle_inductor import FILES, family, restored

FP = cpu_fingerprint()
KEY = "0123456789abcdef"
WHERE = {"model": "mlp", "key_digest": KEY, "fingerprint": FP}


def tier(url: str) -> RemoteTier:
    return RemoteTier(url, timeout_s=0.5, retry_after_s=30.0)


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
    blobs = sorted(server.client.keys(remote_models.BLOB_PREFIX + "*"))
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
