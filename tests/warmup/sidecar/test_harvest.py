"""The harvest: what the server compiles after ready reaches the volume and the remote
tier, whole and checked; bad entries are refused with the volume byte-identical; pods
started later restore what was harvested."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import triton
from prometheus_client import CollectorRegistry

from registry import families
from registry.caches import inductor_cache, triton_cache
from registry.remote import models as remote_models
from registry.remote import triton as remote_triton
from registry.remote.tier import RemoteTier
from registry.storage.store import Store
from tests._trust import UNSIGNED_OK
from tests.conftest import (
    free_port,
    gpu_fingerprint,
    settings_for,
    wait_for,
    write_manifest,
)
from tests.registry.caches.test_triton_cache import compile_in
from tests.registry.test_redis_outage import Proxy, redis  # noqa: F401
from tests.warmup.test_triton_remote_cache import compile_in_pod
from warmup.caches import families as warm_families
from warmup.core.manifest import load_manifest
from warmup.core.metrics import ServeMetrics
from warmup.core.results import ModelResult, RunStatus
from warmup.core.services import Services
from warmup.sidecar.harvest import FOLDERS, Harvester, Limits

ROOT = Path(__file__).resolve().parents[3]
FP = gpu_fingerprint(triton=triton.__version__)  # what the sm90 compile below matches
pytestmark = pytest.mark.slow


@pytest.fixture
def server(redis):  # noqa: F811
    redis.client.flushall()
    return redis


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("compiled")
    compile_in(cache)
    return cache


@pytest.fixture
def pod(tmp_path, compiled):
    """Settings whose server cache holds the compiled kernel, and a ready status."""
    settings = settings_for(tmp_path)
    triton_cache.restore(compiled, settings.folders.triton_cache_dir)
    ready(settings)
    return settings


def ready(settings, fingerprint=FP, **fields) -> None:
    RunStatus(
        state="ready",
        manifest_digest="x",
        started=0.0,
        world_size=1,
        fingerprint=fingerprint.to_json(),
        **fields,
    ).write(settings.paths.status_file)


def harvester(settings, **kwargs) -> Harvester:
    return Harvester(Services(settings), ServeMetrics(CollectorRegistry()), **kwargs)


def group_of(cache: Path) -> Path:
    (group,) = cache.glob("*/__grp__*.json")
    return group


def counted(harvest: Harvester, family: str, result: str) -> float:
    value = harvest.metrics.registry.get_sample_value(
        "triton_warmup_harvest_entries_total", {"family": family, "result": result}
    )
    return value or 0.0


def harvested_by_its_worker(harvest: Harvester) -> None:
    """Start the harvest's worker until it harvested one kernel (10 s at most)."""
    harvest.start()
    try:
        deadline = time.monotonic() + 10
        while counted(harvest, "triton-kernels", "harvested") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        harvest.stop()


def snapshot(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---- Triton kernels -----------------------------------------------------------------------


def test_a_kernel_compiled_after_ready_is_harvested_and_a_later_pod_hits_it(tmp_path, pod):
    harvest = harvester(pod)
    assert harvest.harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "harvested"
    volume = pod.paths.layout.triton_cache
    assert {p.name for p in group_of(volume).parent.iterdir()} == {
        p.name for p in group_of(pod.folders.triton_cache_dir).parent.iterdir()
    }
    assert triton_cache.origins(volume)  # what explain reads
    assert (
        harvest.harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "seen"
    )  # a second event
    assert counted(harvest, "triton-kernels", "harvested") == 1
    later = tmp_path / "later"
    triton_cache.restore(volume, later)
    assert compile_in(later)["hit"]


def test_nothing_is_harvested_before_the_pod_is_ready(tmp_path, pod):
    RunStatus(state="running", manifest_digest="x", started=0.0, world_size=1).write(
        pod.paths.status_file
    )
    assert harvester(pod).harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "waiting"
    assert not pod.paths.layout.triton_cache.exists()


def _foreign(settings: object, group: Path) -> None:
    ready(settings, gpu_fingerprint(cc="8.0", triton=triton.__version__))


def _linked(settings: object, group: Path) -> None:
    (cubin,) = group.parent.glob("*.cubin")
    cubin.rename(group.parent.parent / "elsewhere.cubin")
    cubin.symlink_to(group.parent.parent / "elsewhere.cubin")


def _escaping(settings: object, group: Path) -> None:
    children = json.loads(group.read_text())["child_paths"]
    name = next(iter(children))
    children[name] = "/etc/passwd"
    group.write_text(json.dumps({"child_paths": children}))


def _half_written(settings: object, group: Path) -> None:
    next(group.parent.glob("*.cubin")).unlink()


def _corrupt(settings: object, group: Path) -> None:
    (group.parent / group.name.removeprefix("__grp__")).write_text("{not json")


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (_foreign, "compiled for compute capability 9.0; this pod has 8.0"),
        (_linked, "Too many levels of symbolic links"),
        (_escaping, "outside its folder"),
        (_half_written, "No such file"),
        (_corrupt, "unreadable metadata"),
    ],
    ids=["foreign", "symlink", "escaping", "half-written", "corrupt"],
)
def test_a_bad_kernel_is_refused_in_one_line_and_nothing_is_published(
    pod, server, caplog, spoil, why
):
    group = group_of(pod.folders.triton_cache_dir)
    spoil(pod, group)
    before = snapshot(pod.paths.volume)
    harvest = harvester(pod, remote=RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK))
    assert harvest.harvest("kernel", group) == "refused"
    assert snapshot(pod.paths.volume) == before
    assert server.client.keys("*") == []
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert why in line and "\n" not in line
    assert counted(harvest, "triton-kernels", "refused") == 1


def test_a_kernel_over_the_size_cap_is_refused(pod):
    harvest = harvester(pod, limits=Limits(max_file_bytes=1000))
    assert harvest.harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "refused"
    assert not pod.paths.layout.triton_cache.exists()


def test_n_pods_harvesting_one_kernel_store_it_once(tmp_path, compiled, server):
    pods = []
    for name in ("a", "b", "c"):
        settings = settings_for(tmp_path / name, volume=tmp_path / "shared")
        triton_cache.restore(compiled, settings.folders.triton_cache_dir)
        ready(settings)
        pods.append(settings)
    results = [
        harvester(s, remote=RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)).harvest(
            "kernel", group_of(s.folders.triton_cache_dir)
        )
        for s in pods
    ]
    assert results == ["harvested", "deduplicated", "deduplicated"]
    files = len(list(group_of(compiled).parent.iterdir()))
    assert len(server.client.keys("triton-warmup:blob:*")) == files
    assert len(server.client.keys(f"{remote_triton.NAME_PREFIX}*")) == files


def test_a_remote_outage_mid_harvest_is_published_later_once(tmp_path, pod, server):
    proxy = Proxy(server.port)
    try:
        harvest = harvester(
            pod, remote=RemoteTier(proxy.url, timeout_s=0.3, retry_after_s=0.0, trust=UNSIGNED_OK)
        )
        proxy.down()
        assert (
            harvest.harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "harvested"
        )  # the volume
        assert server.client.keys("*") == []
        proxy.up()
        folder = pod.folders.triton_cache_dir / "AUTOTUNEFOLDER"
        folder.mkdir()
        (folder / "fn.autotune.json").write_text('{"key": [1], "configs_timings": []}')
        assert harvest.harvest("autotune", folder / "fn.autotune.json") == "harvested"
    finally:
        proxy.close()
    kernel = group_of(pod.folders.triton_cache_dir).parent.name
    fetched = remote_triton.fetch(
        RemoteTier(server.url, trust=UNSIGNED_OK),
        kernel,
        [p.name for p in group_of(pod.folders.triton_cache_dir).parent.iterdir()],
    )
    assert len(fetched) == len(list(group_of(pod.folders.triton_cache_dir).parent.iterdir()))
    # a later pod with only the tier: Triton's cache plug-in loads the harvested kernel
    assert compile_in_pod(tmp_path / "later", server.url)["hit"]


# ---- Triton autotune results --------------------------------------------------------------


def test_an_autotune_result_goes_to_the_volume_and_into_the_registry(pod):
    folder = pod.folders.triton_cache_dir / "SOMEKEY"
    folder.mkdir()
    config = {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 2, "num_ctas": 1}
    result = {"key": [4096, "torch.float16"], "configs_timings": [[config, [1.0, 0.9, 1.1]]]}
    (folder / "matmul.autotune.json").write_text(json.dumps(result))
    harvest = harvester(pod)
    assert harvest.harvest("autotune", folder / "matmul.autotune.json") == "harvested"
    assert (pod.paths.layout.triton_cache / "SOMEKEY" / "matmul.autotune.json").is_file()
    assert [e.kernel for e in Store(pod.paths.registry_dir).entries()] == ["matmul"]
    (folder / "bad.autotune.json").write_text("[1, 2]")
    assert harvest.harvest("autotune", folder / "bad.autotune.json") == "refused"


# ---- Inductor -----------------------------------------------------------------------------


def test_inductor_files_compiled_after_ready_join_the_models_index(tmp_path, pod):
    inductor = pod.folders.inductor_cache_dir
    (inductor / "fxgraph").mkdir(parents=True)
    (inductor / "fxgraph" / "warm").write_bytes(b"compiled at warmup")
    root = pod.paths.layout.inductor
    inductor_cache.save(
        inductor, root, model="mlp", key_digest="a" * 16, key={"k": 1}, fingerprint=FP
    )
    model = ModelResult(name="mlp", phase="warm", key_digest="a" * 16)
    ready(pod, models=[model])
    (inductor / "fxgraph" / "traffic").write_bytes(b"compiled under traffic")
    harvest = harvester(pod)
    assert harvest.harvest("inductor", inductor) == "harvested"
    index = inductor_cache.read_index(inductor_cache.index_path(root, "mlp", "a" * 16, FP))
    assert set(index["files"]) == {"fxgraph/warm", "fxgraph/traffic"}
    assert index["key"] == {"k": 1}
    assert harvest.harvest("inductor", inductor) == "deduplicated"


def test_a_declared_folder_written_after_ready_is_kept_and_shared(tmp_path, server):
    engine = tmp_path / "engine-cache"
    text = (
        "version: 1\nmodels: []\nentries:\n"
        "  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}\n"
        f'caches:\n  - {{name: vllm, path: "{engine}", key: "qwen tp1"}}\n'
    )
    pod = settings_for(tmp_path, manifest=write_manifest(tmp_path / "m.yaml", text))
    ready(pod)
    remote = RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)
    harvest = harvester(pod, remote=remote)
    assert engine in harvest.folders  # watched, with the Inductor cache
    (engine / "torch_compile_cache").mkdir(parents=True)
    (engine / "torch_compile_cache" / "graph.py").write_bytes(b"compiled under traffic")
    assert harvest.harvest(FOLDERS, engine) == "harvested"
    assert counted(harvest, "declared-folders", "harvested") == 1
    scope = warm_families.scope(Services(pod), load_manifest(pod.paths.manifest), fingerprint=FP)
    (item,) = scope.folders
    assert families.named("declared-folders").stored(scope, item)
    assert server.client.keys("triton-warmup:caches:vllm:*")  # shared with the fleet
    assert harvest.harvest(FOLDERS, engine) == "deduplicated"


# ---- the watcher --------------------------------------------------------------------------


def test_the_watcher_harvests_a_real_compile_once_it_is_whole(tmp_path):
    settings = settings_for(tmp_path)
    ready(settings)
    harvest = harvester(settings)
    harvest.start()
    try:
        compile_in(settings.folders.triton_cache_dir)
        deadline = time.monotonic() + 20
        while counted(harvest, "triton-kernels", "harvested") < 1:
            assert time.monotonic() < deadline, "not harvested"
            time.sleep(0.1)
    finally:
        harvest.stop()
    assert counted(harvest, "triton-kernels", "refused") == 0
    later = tmp_path / "later"
    triton_cache.restore(settings.paths.layout.triton_cache, later)
    assert compile_in(later)["hit"]


def test_a_flood_waits_for_the_rate_cap_and_past_the_queue_is_dropped(pod):
    harvest = harvester(pod, limits=Limits(max_per_minute=2, max_pending=3))
    for i in range(5):  # folders that are not there: each harvest is a quick refusal
        harvest.offer("kernel", pod.folders.triton_cache_dir / f"K{i}" / "__grp__k.json")
    assert counted(harvest, "triton-kernels", "dropped") == 2
    harvest.start()
    try:
        time.sleep(1.0)
        assert len(harvest.queue.pending()) == 1  # 2 a minute: the third waits
        assert counted(harvest, "triton-kernels", "refused") == 2
    finally:
        harvest.stop()


def test_events_before_ready_are_not_queued_nor_spend_the_rate(pod):
    RunStatus(state="running", manifest_digest="x", started=0.0, world_size=1).write(
        pod.paths.status_file
    )
    harvest = harvester(pod, limits=Limits(max_per_minute=1))
    for i in range(3):  # the init container's own compiles
        harvest.offer("kernel", pod.folders.triton_cache_dir / f"K{i}" / "__grp__k.json")
    assert not harvest.queue.pending()
    ready(pod)
    harvest._ready_checked = -1.0  # the next event reads the status again
    harvest.offer("kernel", group_of(pod.folders.triton_cache_dir))
    harvested_by_its_worker(harvest)


def test_what_the_server_compiled_before_it_told_the_host_is_caught_up(pod):
    """An init that started no rank writes no fingerprint: the server tells it
    (``host.json`` beside its metrics). What it compiled before the harvest knew the
    host (the events were dropped) is offered once the host is known."""
    from warmup.core.results import RankHost

    ready(pod, fingerprint=FP)
    status = RunStatus.read(pod.paths.status_file).model_copy(update={"fingerprint": None})
    status.write(pod.paths.status_file)
    harvest = harvester(pod)
    harvest.offer("kernel", group_of(pod.folders.triton_cache_dir))  # compiled, host unknown
    assert not harvest.queue.pending()
    RankHost(fingerprint=FP.to_json()).write(pod.paths.metrics_dir)
    harvest._ready_checked = -1.0  # the next event reads the status again
    harvest.offer(FOLDERS, pod.folders.inductor_cache_dir)
    assert [kind for kind, _ in harvest.queue.pending()] == ["kernel"]  # the catch-up's
    harvested_by_its_worker(harvest)


def test_a_folder_swapped_for_a_link_is_never_read_through(pod, tmp_path):
    folder = group_of(pod.folders.triton_cache_dir).parent
    elsewhere = tmp_path / "secrets"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)
    harvest = harvester(pod)
    assert harvest.harvest("kernel", folder / next(elsewhere.glob("__grp__*")).name) == "refused"
    assert not pod.paths.layout.triton_cache.exists()


def test_an_unreadable_origin_record_is_replaced_not_fatal(pod):
    records = pod.paths.layout.triton_cache / triton_cache.ORIGINS
    records.mkdir(parents=True)
    harvest = harvester(pod)
    name = f"{triton_cache.Origin.of(FP, {}).digest()[:32]}-harvest.json"
    (records / name).write_text('{"origin": {"triton": 1}, "folders": []}')
    assert harvest.harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "harvested"
    assert triton_cache.origins(pod.paths.layout.triton_cache)
    triton_cache.save(
        pod.folders.triton_cache_dir,
        pod.paths.layout.triton_cache,
        triton_cache.Origin.of(FP, {}),
    )


def test_remote_models_index_is_published_too(tmp_path, pod, server):
    inductor = pod.folders.inductor_cache_dir
    (inductor / "fxgraph").mkdir(parents=True)
    (inductor / "fxgraph" / "traffic").write_bytes(b"compiled under traffic")
    root = pod.paths.layout.inductor
    inductor_cache.save(inductor, root, model="mlp", key_digest="a" * 16, key={}, fingerprint=FP)
    ready(pod, models=[ModelResult(name="mlp", phase="warm", key_digest="a" * 16)])
    remote = RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)
    harvester(pod, remote=remote).harvest("inductor", inductor)
    other = tmp_path / "other-volume"
    assert remote_models.fetch(remote, other, model="mlp", key_digest="a" * 16, fingerprint=FP)


class DurableRedis:
    """A redis-server that persists every acknowledged write (AOF, fsync always), on one
    port and folder across restarts."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        options = ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             *options, "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = RemoteTier(self.url, trust=UNSIGNED_OK).client
        assert wait_for(lambda: _pings(client), 15), "redis-server did not start"

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # no shutdown save: only what the AOF holds survives
        self.proc.wait()


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


def test_redis_restarting_mid_publish_loses_nothing_acknowledged_and_duplicates_nothing(
    tmp_path, pod, monkeypatch
):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = DurableRedis(tmp_path / "redis")
    server.folder.mkdir()
    server.start()
    try:
        tier = RemoteTier(server.url, timeout_s=0.5, retry_after_s=0.0, trust=UNSIGNED_OK)
        harvest = harvester(pod, remote=tier)
        publish, calls = remote_triton.publish, []

        def crashing(*args, **kwargs):  # redis dies after the kernel's second file
            calls.append(args[2])
            if len(calls) == 3:
                server.stop()
            return publish(*args, **kwargs)

        monkeypatch.setattr(remote_triton, "publish", crashing)
        assert harvest.harvest("kernel", group_of(pod.folders.triton_cache_dir)) == "harvested"
        acknowledged = calls[:2]
        server.start()
        client = RemoteTier(server.url, trust=UNSIGNED_OK).client
        held = {k.decode().rsplit(":", 1)[1] for k in client.keys(f"{remote_triton.NAME_PREFIX}*")}
        assert held == set(acknowledged)  # what redis acknowledged survived its restart
        monkeypatch.setattr(remote_triton, "publish", publish)
        folder = pod.folders.triton_cache_dir / "NEXTKEY"
        folder.mkdir()
        (folder / "fn.autotune.json").write_text('{"key": [1], "configs_timings": []}')
        assert harvest.harvest("autotune", folder / "fn.autotune.json") == "harvested"
        kernel = group_of(pod.folders.triton_cache_dir).parent
        names = client.keys(f"{remote_triton.NAME_PREFIX}{kernel.name}:*")
        assert len(names) == len(list(kernel.iterdir()))  # the rest, published on retry
        blobs = client.keys("triton-warmup:blob:*")
        assert len(blobs) == len(list(kernel.iterdir())) + 1  # each content once
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
