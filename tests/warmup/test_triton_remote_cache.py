"""Triton's cache plug-ins over the remote tier, with real Triton compiles for sm90 (no
GPU needed) in fresh processes: what one pod compiled, another loads instead of
compiling; the local cache stays in Triton's own format; redis down is a local compile."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from registry.caches import triton_cache
from registry.remote import models as remote_models
from registry.remote import triton as remote_triton
from registry.remote.tier import RemoteTier
from tests._trust import UNSIGNED_OK
from tests.conftest import env_without_interpreter
from tests.registry._trickle import trickling, within
from tests.registry.test_redis_outage import Proxy, redis  # noqa: F401
from warmup import triton_remote_cache
from warmup.serving.metrics import ServingMetrics
from warmup.triton_remote_cache import RemoteBackend, TieredCacheManager

MANAGER = "warmup.triton_remote_cache:TieredCacheManager"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def server(redis):  # noqa: F811
    redis.client.flushall()
    return redis


def compile_in_pod(cache: Path, url: str, *, plain: bool = False, **env: str) -> dict:
    """``tests.warmup._compile_remote`` in a fresh process: its report. ``plain``:
    Triton's own file cache manager."""
    environ = env_without_interpreter(
        TRITON_CACHE_DIR=str(cache),
        TRITON_WARMUP_REMOTE_URL=url,
        TRITON_WARMUP_ALLOW_UNSIGNED="true",
    )
    environ.update(PYTHONPATH=str(ROOT), **env)
    if not plain:
        environ["TRITON_CACHE_MANAGER"] = MANAGER
    done = subprocess.run(
        [sys.executable, "-m", "tests.warmup._compile_remote", "256"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return {**json.loads(done.stdout.splitlines()[-1]), "stderr": done.stderr}


def test_a_kernel_one_pod_compiled_is_loaded_by_another_and_kept_in_tritons_format(
    tmp_path, server
):
    first = compile_in_pod(tmp_path / "a", server.url)
    assert not first["hit"] and first["remote"]["published"] >= 3
    second = compile_in_pod(tmp_path / "b", server.url)
    assert second["hit"] and second["remote"]["misses"] == 0
    assert second["cubin"] == first["cubin"]
    # What the remote hit wrote is a plain Triton cache: Triton's own manager hits on it,
    # and the volume's save and restore carry it to a third folder that hits too.
    plain = compile_in_pod(tmp_path / "b", "off", plain=True)
    assert plain["hit"] and plain["remote"]["hits"] == 0
    triton_cache.save(tmp_path / "b", tmp_path / "volume")
    triton_cache.restore(tmp_path / "volume", tmp_path / "c")
    assert compile_in_pod(tmp_path / "c", "off", plain=True)["hit"]


def test_a_local_hit_never_asks_the_network(tmp_path, server):
    compile_in_pod(tmp_path / "a", server.url)
    again = compile_in_pod(tmp_path / "a", server.url)
    assert again["hit"] and again["remote"] == {
        "hits": 0,
        "misses": 0,
        "published": 0,
        "refused": 0,
    }


def test_a_group_short_of_a_file_on_the_tier_compiles_locally(tmp_path, server):
    compile_in_pod(tmp_path / "a", server.url)
    cubins = [
        k for k in server.client.keys(f"{remote_triton.NAME_PREFIX}*") if k.endswith(b".cubin")
    ]
    assert len(cubins) == 1
    server.client.delete(cubins[0])
    again = compile_in_pod(tmp_path / "b", server.url)
    assert not again["hit"] and again["remote"]["misses"] >= 1


@pytest.mark.parametrize("outage", ["down", "stall"])
def test_redis_down_or_stalled_is_a_local_compile_within_its_timeout(tmp_path, server, outage):
    reference = compile_in_pod(tmp_path / "warm", "off")
    proxy = Proxy(server.port)
    try:
        getattr(proxy, outage)()
        pod = compile_in_pod(tmp_path / "a", proxy.url, TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S="0.2")
    finally:
        proxy.close()
    assert not pod["hit"] and pod["cubin"] == reference["cubin"]
    assert pod["remote"]["hits"] == 0 and pod["remote"]["published"] == 0
    assert pod["seconds"] < reference["seconds"] + 2.0  # one wait of 0.2 s, then skipped
    assert pod["stderr"].count("unreachable") == 1


@pytest.fixture
def tiered(tmp_path, server, monkeypatch):
    """TieredCacheManager in this process, on ``server``, with a zeroed count."""
    monkeypatch.setenv("TRITON_WARMUP_REMOTE_URL", server.url)
    monkeypatch.setenv("TRITON_WARMUP_ALLOW_UNSIGNED", "true")  # kernels shared unsigned
    monkeypatch.setattr(triton_remote_cache, "stats", triton_remote_cache.RemoteCacheStats())
    triton_remote_cache.process_tier.cache_clear()
    yield
    triton_remote_cache.process_tier.cache_clear()


def test_a_file_outside_a_group_goes_through_the_tier_too(tmp_path, monkeypatch, tiered):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a"))
    TieredCacheManager("KEY1").put(b'{"configs_timings": []}', "fn.autotune.json", binary=True)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "b"))
    found = TieredCacheManager("KEY1").get_file("fn.autotune.json")
    assert found is not None and Path(found).read_bytes() == b'{"configs_timings": []}'
    assert Path(found).parent == tmp_path / "b" / "KEY1"
    assert TieredCacheManager("KEY1").get_file("other.json") is None
    expected = {"hits": 1, "misses": 1, "published": 1, "refused": 0}
    assert asdict(triton_remote_cache.stats) == expected
    registry = ServingMetrics(CollectorRegistry()).registry
    for outcome, seen in expected.items():
        sample = "triton_warmup_triton_remote_files_total"
        assert registry.get_sample_value(sample, {"outcome": outcome, "rank": "0"}) == seen


def test_host_code_is_never_shared(tmp_path, monkeypatch, server, tiered):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a"))
    TieredCacheManager("KEY1").put(b"\x7fELF stub", "__triton_launcher.so")
    assert server.client.keys("*") == []
    remote_triton.publish(RemoteTier(server.url, trust=UNSIGNED_OK), "KEY1", "cuda_utils.so", b"x")
    assert server.client.keys("*") == []  # refused by the tier's own check too


@pytest.mark.parametrize(
    "group",
    [
        b'{"child_paths": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",  # nested too deep
        b'{"child_paths": [1, 2]}',
        b'{"child_paths": [["k.json"]]}',
        b'{"child_paths": ["k.cubin"]}',  # not its own metadata file
        b'{"child_paths": ["k.json", "../../etc/passwd"]}',
        b'{"child_paths": ["k.json", "__triton_launcher.so"]}',
        b"[]",
        b"not json",
    ],
    ids=["deep", "ints", "lists", "no-metadata", "path", "host-code", "list", "garbage"],
)
def test_a_group_on_the_tier_that_is_no_group_is_a_miss_never_an_error(
    tmp_path, monkeypatch, server, tiered, group
):
    tier = RemoteTier(server.url, trust=UNSIGNED_OK)
    remote_triton.publish(tier, "KEY1", "k.json", b"{}")
    remote_triton.publish(tier, "KEY1", "k.cubin", b"cubin")
    sha = hashlib.sha256(group).hexdigest()
    server.client.set(remote_models.blob_key(sha), group)
    server.client.set(remote_triton.name_key("KEY1", "__grp__k.json"), f"{sha} {len(group)}")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a"))
    assert TieredCacheManager("KEY1").get_group("k.json") is None
    assert triton_remote_cache.stats.misses == 1


@pytest.mark.parametrize(
    "names", [[1, 2], [["k.json"]], None, "k.json", [{"a": 1}], ["k.json", ["x"]], ["k.json", 3]]
)
def test_the_plug_in_never_raises_on_what_tritons_manager_hands_it(server, tiered, names):
    # Triton's RemoteCacheManager passes a remote group's child_paths on unchecked
    remote_triton.publish(RemoteTier(server.url, trust=UNSIGNED_OK), "KEY1", "k.json", b"{}")
    found = RemoteBackend("KEY1").get(names)
    assert found in ({}, {"k.json": b"{}"})
    assert triton_remote_cache.stats.misses == 1


def test_without_a_remote_tier_it_is_tritons_file_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_WARMUP_REMOTE_URL", "off")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    triton_remote_cache.process_tier.cache_clear()
    manager = TieredCacheManager("KEY1")
    assert manager.remote is None
    assert manager.get_file("x.json") is None
    triton_remote_cache.process_tier.cache_clear()


def test_a_dump_or_override_manager_stays_local(tmp_path, server, monkeypatch):
    monkeypatch.setenv("TRITON_WARMUP_REMOTE_URL", server.url)
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    triton_remote_cache.process_tier.cache_clear()
    TieredCacheManager("KEY1", dump=True).put(b"x", "k.ttir")
    assert server.client.keys("*") == []
    triton_remote_cache.process_tier.cache_clear()


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_trickling_server_is_a_local_compile_within_the_deadline(tmp_path, monkeypatch, kind):
    with trickling(kind, tmp_path) as hostile:
        monkeypatch.setenv("TRITON_WARMUP_REMOTE_URL", hostile.url)
        monkeypatch.setenv("TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S", "0.5")
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setattr(triton_remote_cache, "stats", triton_remote_cache.RemoteCacheStats())
        triton_remote_cache.process_tier.cache_clear()
        try:
            manager = TieredCacheManager("KEY1")
            assert manager.remote is not None
            with within(1.0):  # one call of 0.5 s, then the tier is skipped
                assert manager.get_file("k.cubin") is None
                assert manager.get_group("k.json") is None
            with within(1.0):
                assert RemoteBackend("KEY2").get(["k.cubin"]) == {}
        finally:
            triton_remote_cache.process_tier.cache_clear()
