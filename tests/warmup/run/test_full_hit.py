"""The init container on a full hit: restore, a ready status, exit; no rank, no torch."""

import json
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from registry import Entry, KernelConfig
from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from registry.remote import models as remote_models
from registry.storage import hosts
from registry.storage.hosts import HostRecord, Probe
from tests._trust import UNSIGNED_OK
from tests.conftest import ROOT, settings_for, write_manifest
from warmup.compiled.key import model_key
from warmup.core.manifest import load_manifest
from warmup.core.results import READY, RunStatus, ShapeResult
from warmup.core.services import Services
from warmup.run import full_hit

MANIFEST = """version: 1
entries:
  - kernel: ag_gemm
    dtype: fp32
    world_size: 2
    shapes: [{M: 32, N: 32, K: 32}, {M: 64, N: 48, K: 32}]
  - kernel: "tests.warmup.user_functions:record_call"
    dtype: fp32
    world_size: 2
    shapes: [{M: 8, N: 8, K: 8}]
models:
  - name: mlp
    build: warmup.demo:compiled_mlp
    world_size: 2
    dims: {batch: [1, 8]}
    inputs:
      - {shape: [batch, 64], dtype: fp32}
"""
PROBE = Probe(device="cpu", python="3.11.0", kernels="k1")
HASH = "h" * 16


def key_of(shape):
    return {**shape, "dtype": "fp32", "world": 2}


def shapes_of(manifest):
    return [(e.kernel, e.dtype, 2, s) for e in manifest.entries for s in e.expand()]


@pytest.fixture
def warm_volume(tmp_path):
    """A volume as a ready full run leaves it: entries, the model's artifacts, a record."""
    settings = settings_for(tmp_path, manifest=write_manifest(tmp_path / "m.yaml", MANIFEST))
    settings.paths.layout.registry.mkdir(parents=True)
    manifest = load_manifest(settings.paths.manifest)
    fingerprint = cpu_fingerprint()
    store = Services(settings).store()
    for kernel, _, _, shape in shapes_of(manifest):
        if kernel == "ag_gemm":
            best = KernelConfig.make({"BLOCK_M": shape["M"]})
            store.put(Entry.make(kernel, key_of(shape), fingerprint.with_kernel(HASH), best))
    cache = tmp_path / "made-by-pod-a"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "graph.bin").write_bytes(b"compiled")
    key = model_key(manifest.model("mlp"))
    inductor_cache.save(
        cache, settings.paths.layout.inductor, model="mlp", key_digest=key.digest, key=key.parts,
        fingerprint=fingerprint,
    )  # fmt: skip
    items = hosts.items_of((*item, key_of(item[3])) for item in shapes_of(manifest))
    for item in items.values():
        if item["kernel"] != "ag_gemm":  # a user function, as its module's source is
            item["source"] = full_hit.user_source(item["kernel"])
    record = HostRecord(PROBE.to_json(), fingerprint, {}, {"ag_gemm": HASH}, items)
    hosts.write_record(settings.paths.layout.hosts, PROBE, record)
    return settings, manifest


def test_every_declared_shape_and_model_stored_is_a_full_hit(warm_volume):
    settings, manifest = warm_volume
    hit = full_hit.look(Services(settings, run=True), manifest, 2, PROBE)
    assert isinstance(hit, full_hit.FullHit)
    assert [(s.source, s.key["M"]) for s in hit.shapes] == [
        ("registry", 32),
        ("registry", 64),
        ("user", 8),
    ]
    assert hit.shapes[0].config == KernelConfig.make({"BLOCK_M": 32}).to_json()
    assert [model.name for model, _ in hit.models] == ["mlp"]


def test_each_miss_is_named_in_one_line(warm_volume, tmp_path, monkeypatch):
    settings, manifest = warm_volume
    other_host = Probe(device="cpu", python="3.12.0", kernels="k1")
    assert "no warm run has recorded" in full_hit.look(
        Services(settings, run=True), manifest, 2, other_host
    )
    grown = MANIFEST.replace(
        "{M: 64, N: 48, K: 32}", "{M: 64, N: 48, K: 32}, {M: 128, N: 48, K: 32}"
    )
    wider = load_manifest(write_manifest(tmp_path / "wider.yaml", grown))
    assert full_hit.look(Services(settings, run=True), wider, 2, PROBE) == (
        "ag_gemm fp32 M=128 N=48 K=32 was never warmed on a host like this one"
    )
    recorded = hosts.read_record(settings.paths.layout.hosts, PROBE)
    edited = HostRecord(
        recorded.probe, recorded.fingerprint, {}, {"ag_gemm": "edited"}, recorded.items
    )
    hosts.record_path(settings.paths.layout.hosts, PROBE).write_text(json.dumps(edited.to_json()))
    assert full_hit.look(Services(settings, run=True), manifest, 2, PROBE) == (
        "ag_gemm fp32 M=32 N=32 K=32 is not stored for this host's fingerprint"
    )
    hosts.record_path(settings.paths.layout.hosts, PROBE).write_text(json.dumps(recorded.to_json()))
    renamed = load_manifest(
        write_manifest(tmp_path / "r.yaml", MANIFEST.replace("name: mlp", "name: other"))
    )
    assert full_hit.look(Services(settings, run=True), renamed, 2, PROBE) == (
        "model other is not stored for this host's fingerprint"
    )
    hosts.record_path(settings.paths.layout.hosts, PROBE).write_text("{}")
    assert full_hit.look(Services(settings, run=True), manifest, 2, PROBE).startswith(
        "the host record is unusable"
    )
    # what cannot be read (an index a stat fails on): a miss, never the init's failure
    hosts.record_path(settings.paths.layout.hosts, PROBE).write_text(json.dumps(recorded.to_json()))

    def unreadable(*args):
        raise PermissionError(13, "Permission denied", "models/mlp")

    monkeypatch.setattr(full_hit, "_stored_models", unreadable)
    assert full_hit.look(Services(settings, run=True), manifest, 2, PROBE) == (
        "the stored state could not be read (PermissionError: [Errno 13] Permission denied: "
        "'models/mlp')"
    )


def test_a_user_functions_module_that_changed_is_not_a_hit(warm_volume, monkeypatch):
    settings, manifest = warm_volume
    assert isinstance(
        full_hit.look(Services(settings, run=True), manifest, 2, PROBE), full_hit.FullHit
    )
    monkeypatch.setattr(full_hit, "user_source", lambda function: "edited")
    assert full_hit.look(Services(settings, run=True), manifest, 2, PROBE) == (
        "tests.warmup.user_functions:record_call fp32 M=8 N=8 K=8: its function's module "
        "changed since it was warmed"
    )


def test_a_full_hit_restores_and_writes_a_ready_status_with_its_metrics(warm_volume):
    settings, manifest = warm_volume
    hit = full_hit.look(Services(settings, run=True), manifest, 2, PROBE)
    status = full_hit.restore_and_finish(
        Services(settings, run=True), manifest, 2, hit, started=0.0, phases={"imports": 0.3}
    )
    assert status.state == READY and status.full_hit and status.failures == []
    assert RunStatus.read(settings.paths.status_file) == status
    assert [(m.name, m.phase, m.restore) for m in status.models] == [("mlp", "restored", "hit")]
    assert (
        settings.folders.inductor_cache_dir / "fxgraph" / "graph.bin"
    ).read_bytes() == b"compiled"
    assert set(status.phases) == {"imports", "restore"}
    assert status.fingerprint == cpu_fingerprint().to_json()
    families = {
        f.name for f in text_string_to_metric_families(settings.paths.run_metrics_file.read_text())
    }
    assert "triton_warmup_configs" in families


def test_a_full_hit_s_metrics_say_the_ranks_it_is_warm_for_and_that_none_ran(warm_volume):
    # a full hit of a 2-rank warm starts no rank process, and is still warm for 2 ranks:
    # the ranks gauge said 0 after the demo's full hit
    settings, manifest = warm_volume
    services = Services(settings, run=True)
    hit = full_hit.look(services, manifest, 2, PROBE)
    full_hit.restore_and_finish(services, manifest, 2, hit, started=0.0, phases={})
    text = settings.paths.run_metrics_file.read_text()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert values["triton_warmup_ranks"] == 2
    assert values["triton_warmup_rank_processes"] == 0


def ready_status(manifest, shapes):
    return RunStatus(
        state=READY, manifest_digest=manifest.digest(), started=0.0, world_size=2,
        fingerprint=cpu_fingerprint().with_kernel(HASH).to_json(), shapes=shapes,
    )  # fmt: skip


def test_a_ready_full_run_records_its_host_and_keys(warm_volume, tmp_path):
    settings, manifest = warm_volume
    found = Probe(device="cpu", python="3.11.0", kernels="new")
    results = [
        ShapeResult(kernel=kernel, key=key_of(shape), rank=rank, source="tuned")
        for rank in (1, 0)
        for kernel, _, _, shape in shapes_of(manifest)
    ]
    full_hit.record_host(
        Services(settings, run=True), manifest, 2, found, ready_status(manifest, results)
    )
    record = hosts.read_record(settings.paths.layout.hosts, found)
    assert record.fingerprint == cpu_fingerprint()  # the kernel hash is per kernel
    assert record.kernel_hashes["ag_gemm"]  # the adapter's own source hash
    assert len(record.items) == 3
    user = hosts.item_id(
        "tests.warmup.user_functions:record_call", "fp32", 2, {"M": 8, "N": 8, "K": 8}
    )
    assert record.items[user]["source"] == full_hit.user_source(record.items[user]["kernel"])
    assert len(record.items[user]["source"]) == 64
    item = hosts.item_id("ag_gemm", "fp32", 2, {"M": 64, "N": 48, "K": 32})
    assert record.items[item]["key"] == key_of({"M": 64, "N": 48, "K": 32})


def test_a_status_that_does_not_pair_with_the_manifest_records_nothing(warm_volume, caplog):
    settings, manifest = warm_volume
    found = Probe(device="cpu", kernels="none-yet")
    one = [ShapeResult(kernel="ag_gemm", key=key_of({"M": 32, "N": 32, "K": 32}), source="tuned")]
    full_hit.record_host(
        Services(settings, run=True), manifest, 2, found, ready_status(manifest, one)
    )
    failed = ready_status(manifest, []).failed(["a rank died"])
    full_hit.record_host(Services(settings, run=True), manifest, 2, found, failed)
    assert hosts.read_record(settings.paths.layout.hosts, found) is None
    assert "rank 0 reported other shapes than declared" in caplog.text


def test_a_pod_on_an_empty_volume_finds_its_full_hit_on_the_remote_tier(
    warm_volume, tmp_path, redis_url
):
    from registry.remote.tier import RemoteTier

    settings, manifest = warm_volume
    tier = RemoteTier(redis_url, trust=UNSIGNED_OK)
    for entry in Services(settings).store().entries():
        assert tier.publish(entry)
    key = model_key(manifest.model("mlp"))
    fingerprint = cpu_fingerprint()
    where = {"model": "mlp", "key_digest": key.digest, "fingerprint": fingerprint}
    assert remote_models.publish(tier, settings.paths.layout.inductor, **where)
    empty = settings.updated(volume=tmp_path / "other-node")
    empty.paths.layout.registry.mkdir(parents=True)
    assert "no warm run has recorded" in full_hit.look(
        Services(empty, run=True), manifest, 2, PROBE, tier
    )
    record = hosts.read_record(settings.paths.layout.hosts, PROBE)
    assert hosts.publish_record(tier, PROBE, record)
    hit = full_hit.look(Services(empty, run=True), manifest, 2, PROBE, tier)
    assert isinstance(hit, full_hit.FullHit), hit
    assert len(Services(empty).store().entries()) == 2  # fetched into this volume
    assert inductor_cache.index_path(empty.paths.layout.inductor, **where).is_file()
    assert (
        hosts.read_record(empty.paths.layout.hosts, PROBE) == record
    )  # the next pod reads it here
    status = full_hit.restore_and_finish(
        Services(empty, run=True), manifest, 2, hit, started=0.0, phases={}
    )
    assert [m.restore for m in status.models] == ["hit"]


def test_a_remote_tier_missing_a_shape_leaves_the_full_warm(warm_volume, tmp_path, redis_url):
    from registry.remote.tier import RemoteTier

    settings, manifest = warm_volume
    tier = RemoteTier(redis_url, trust=UNSIGNED_OK)
    tier.client.flushall()
    hosts.publish_record(tier, PROBE, hosts.read_record(settings.paths.layout.hosts, PROBE))
    empty = settings.updated(volume=tmp_path / "other-node")
    empty.paths.layout.registry.mkdir(parents=True)
    assert full_hit.look(Services(empty, run=True), manifest, 2, PROBE, tier) == (
        "ag_gemm fp32 M=32 N=32 K=32 is not stored for this host's fingerprint"
    )
    # the record is kept on this volume: what is stored is restored, the rest warmed
    assert hosts.read_record(empty.paths.layout.hosts, PROBE) is not None


@pytest.mark.slow
def test_the_second_run_of_a_warm_volume_exits_without_ranks_or_torch(tmp_path):
    """Two runs of the program: the first warms in ranks and records the host; the
    second, in a new work folder, is a full hit that never imports torch."""
    env_root = tmp_path
    code = (
        "import sys, json; from warmup.cli import main; "
        "code = main(['run', '--manifest', sys.argv[1], '--volume', sys.argv[2], "
        "'--create-volume', '--device', 'cpu']); "
        "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))"
    )
    manifest = ROOT / "tests" / "kernels_demo.yaml"
    outs = []
    for work in ("pod-a", "pod-b"):
        env = {"TRITON_WARMUP_WORK_DIR": str(env_root / work), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, "-c", code, str(manifest), str(env_root / "volume")],
            capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outs[0] == {"code": 0, "torch": True}
    assert outs[1] == {"code": 0, "torch": False}
    second = RunStatus.read(env_root / "pod-b" / "status.json")
    assert second.full_hit and second.sources == {"registry": 3}


def test_models_only_are_left_to_the_server_without_a_rank(warm_volume, tmp_path):
    settings, manifest = warm_volume
    server = settings.updated(models_on_miss="server")
    models_only = manifest.model_copy(update={"entries": []})
    assert full_hit.nothing_for_ranks(Services(server, run=True), models_only, 2)
    assert not full_hit.nothing_for_ranks(
        Services(server, run=True), manifest, 2
    )  # its kernels need ranks
    assert not full_hit.nothing_for_ranks(
        Services(settings, run=True), models_only, 2
    )  # init compiles them
    status = full_hit.leave_to_the_server(
        Services(server, run=True), models_only, 2, PROBE, started=0.0, phases={}
    )
    assert status.ready and status.probe == PROBE.to_json()
    assert [(m.phase, m.restore) for m in status.models] == [("restored", "hit")]  # recorded
    assert status.fingerprint == cpu_fingerprint().to_json()
    unseen = Probe(device="cpu", python="0.0.0")
    status = full_hit.leave_to_the_server(
        Services(server, run=True), models_only, 2, unseen, started=0.0, phases={}
    )
    assert status.ready and status.fingerprint is None  # the server tells it
    assert [m.phase for m in status.models] == ["deferred"]
    broken = MANIFEST.replace("warmup.demo:compiled_mlp", "no_such_module_here:build")
    bad = load_manifest(write_manifest(tmp_path / "bad.yaml", broken))
    bad = bad.model_copy(update={"entries": []})
    status = full_hit.leave_to_the_server(
        Services(server, run=True), bad, 2, PROBE, started=0.0, phases={}
    )
    assert status.state == "failed" and "no_such_module_here" in status.failures[0]


def test_a_full_hit_restores_each_declared_folder_stored_for_the_host(warm_volume, tmp_path):
    from warmup.caches import families
    from warmup.core.manifest import parse_manifest

    settings, _ = warm_volume
    engine = tmp_path / "engine"
    text = MANIFEST + f'caches:\n  - {{name: vllm, path: "{engine}", key: "qwen tp2"}}\n'
    with_caches = parse_manifest(text)
    (engine / "kernels").mkdir(parents=True)
    (engine / "kernels" / "k.bin").write_bytes(b"engine kernel")
    host = families.scope(Services(settings), with_caches, fingerprint=cpu_fingerprint())
    families.save(host)  # as the harvest of an earlier pod left it
    (engine / "kernels" / "k.bin").unlink()
    hit = full_hit.look(Services(settings, run=True), with_caches, 2, PROBE)
    status = full_hit.restore_and_finish(
        Services(settings, run=True), with_caches, 2, hit, started=0.0, phases={}
    )
    assert status.state == READY
    assert (engine / "kernels" / "k.bin").read_bytes() == b"engine kernel"


def test_a_full_hit_counts_the_entries_it_skipped_as_a_warm_run_does(warm_volume, tmp_path):
    from warmup.core.manifest import parse_manifest

    settings, _ = warm_volume
    other = "  - {kernel: matmul, dtype: fp32, world_size: 4, shapes: [{M: 8, N: 8, K: 8}]}\n"
    with_other = parse_manifest(MANIFEST.replace("models:\n", other + "models:\n"))
    hit = full_hit.look(Services(settings, run=True), with_other, 2, PROBE)
    status = full_hit.restore_and_finish(
        Services(settings, run=True), with_other, 2, hit, started=0.0, phases={}
    )
    assert len(status.skipped_entries) == 1
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(settings.paths.run_metrics_file.read_text())
        for s in f.samples
    }
    assert samples["triton_warmup_skipped_entries"] == 1
