"""The sidecar: probes, metrics, and bundles installed while it keeps answering."""

import contextlib
import dataclasses
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import warmup.sidecar.readiness
from registry import Entry, KernelConfig, RegistryError, Store, cpu_fingerprint
from registry.bundles import bundle
from tests.conftest import free_port, gpu_fingerprint, wait_for
from warmup.core.manifest import load_manifest
from warmup.core.metrics import RunMetrics
from warmup.core.results import ModelResult, RunStatus, ServerWarm, ShapeResult
from warmup.core.settings import Settings
from warmup.serving.metrics import ServingMetrics
from warmup.sidecar.server import Sidecar

ROOT = Path(__file__).parents[3]
DEMO = ROOT / "tests" / "kernels_demo.yaml"


@pytest.fixture
def settings(tmp_path):
    return Settings(
        volume=tmp_path / "volume", work_dir=tmp_path / "work", manifest=DEMO, reload_debounce_s=0.1
    )


@contextlib.contextmanager
def running(settings, **attributes):
    """A started sidecar on a free local port (``url`` set), stopped at the end; the
    ``attributes`` are set on its watcher before it starts."""
    car = Sidecar(settings)
    for name, value in attributes.items():
        setattr(car.watcher, name, value)
    car.url = f"http://127.0.0.1:{car.start(host='127.0.0.1', port=0)}"
    try:
        yield car
    finally:
        car.stop()


@pytest.fixture
def sidecar(settings):
    with running(settings) as car:
        yield car


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def ready_status(settings, **changes):
    shape = ShapeResult(kernel="ag_gemm", key={"M": 32}, source="registry")
    fields = {
        "state": "ready",
        "manifest_digest": load_manifest(DEMO).digest(),
        "fingerprint": cpu_fingerprint().to_json(),
        "world_size": 2,
        "started": 0.0,
        "shapes": [shape] * 6,
        **changes,
    }
    RunStatus(**fields).write(settings.paths.status_file)


def test_readiness_goes_from_503_to_200(sidecar, settings):
    code, body = get(sidecar.url + "/readyz")
    assert code == 503 and json.loads(body)["reason"].startswith("no warmup has run yet")
    ready_status(settings, state="running", shapes=[])
    code, body = get(sidecar.url + "/readyz")
    assert code == 503 and json.loads(body)["reason"] == "warmup is running"
    ready_status(settings)
    code, body = get(sidecar.url + "/readyz")
    assert code == 200 and json.loads(body) == {
        "ready": True,
        "degraded": False,
        "manifest": load_manifest(DEMO).digest(),
        "registry_entries": 0,
        "shapes": 6,
        "models": [],
        "skipped_entries": [],
    }


def test_entries_for_other_world_sizes_are_ready_but_degraded_and_named(sidecar, settings):
    skipped = ["entries.1 (ag_gemm, world size 8)"]
    ready_status(settings, skipped_entries=skipped)
    code, body = get(sidecar.url + "/readyz")
    answer = json.loads(body)
    assert code == 200 and answer["degraded"] is True and answer["skipped_entries"] == skipped


def test_a_run_of_compiled_models_alone_is_ready_and_names_them(sidecar, settings):
    model = ModelResult(name="blocks", phase="warm")
    ready_status(settings, shapes=[], models=[model, model.model_copy(update={"rank": 1})])
    code, body = get(sidecar.url + "/readyz")
    assert code == 200 and json.loads(body)["models"] == ["blocks"]


def test_readiness_can_follow_the_servers_declared_warm_ranks(settings):
    """``ready_after_server``: the init's status, then every server rank primed and
    declared warm (``Serving.declare_warm``) for this manifest; a rank that starts
    again is not warm until it says so again."""
    from warmup.serving import Serving

    settings = settings.updated(ready_after_server=2)
    ready_status(settings)
    with running(settings) as car:
        code, body = get(car.url + "/readyz")
        assert code == 503
        assert json.loads(body)["reason"] == (
            "the server has not declared itself warm (0 of 2 ranks)"
        )
        with Serving(settings, rank=0, follow=False) as rank0:
            rank0.declare_warm()
            stale = ServerWarm(rank="1", manifest_digest="another manifest", declared=0.0)
            stale.write(settings.paths.metrics_dir)
            assert "(1 of 2 ranks)" in wait_for_reason(car)
            with Serving(settings, rank=1, follow=False) as rank1:  # it starts again
                assert not ServerWarm.path(settings.paths.metrics_dir, 1).exists()
                rank1.declare_warm()
                assert wait_for_code(car, 200)
            assert wait_for_code(car, 503)  # rank 1 closed: no longer warm


def wait_for_reason(car):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, body = get(car.url + "/readyz")
        reason = json.loads(body).get("reason", "")
        if "0 of" not in reason:
            return reason
        time.sleep(0.05)
    return reason


def wait_for_code(car, code):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if get(car.url + "/readyz")[0] == code:
            return True
        time.sleep(0.05)
    return False


def test_a_failed_model_is_not_ready_and_named(sidecar, settings):
    failed = ModelResult(name="blocks", phase="failed", error="build raised OSError: no weights")
    ready_status(settings, state="failed", models=[failed])
    code, body = get(sidecar.url + "/readyz")
    assert code == 503
    assert json.loads(body)["failures"] == [
        "model blocks (rank 0): build raised OSError: no weights"
    ]


@pytest.mark.parametrize(
    "changes,reason",
    [
        ({"manifest_digest": "0" * 16}, "the last warmup was for another manifest"),
        ({"state": "failed", "errors": ["ag_gemm {'M': 32}: boom"]}, "warmup is failed"),
        ({"shapes": []}, "the last warmup warmed no shape"),
    ],
)
def test_not_ready_says_why(sidecar, settings, changes, reason):
    ready_status(settings, **changes)
    code, body = get(sidecar.url + "/readyz")
    assert code == 503 and json.loads(body)["reason"] == reason


def test_an_invalid_manifest_is_not_ready(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 7\n")
    car = Sidecar(Settings(volume=tmp_path / "v", work_dir=tmp_path / "w", manifest=bad))
    ready, body = car.readiness()
    assert not ready and body["reason"] == "manifest is invalid" and body["errors"]


def test_health_metrics_and_unknown_paths(sidecar, settings):
    assert get(sidecar.url + "/healthz") == (200, '{"alive": true}')
    assert get(sidecar.url + "/nope")[0] == 404
    run = RunMetrics()
    run.record([ShapeResult(kernel="ag_gemm", key={"M": 8}, source="tuned", seconds=1.5)] * 2)
    run.ranks.set(2)
    run.write(settings.paths.run_metrics_file)
    code, text = get(sidecar.url + "/metrics")
    names = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert code == 200
    assert names["triton_warmup_tuning_seconds_count"] == 2  # the run's numbers
    assert names["triton_warmup_ranks"] == 2
    assert "triton_warmup_ready" in names and "triton_warmup_registry_entries" in names
    modes = samples(text, "triton_warmup_trust_mode")
    mode = "unsigned-allowed" if settings.trust.allow_unsigned else "code-refused"
    assert {labels[0][1]: value for labels, value in modes.items() if value} == {mode: 1}
    assert len(modes) == 3  # signed, code-refused, unsigned-allowed: one of them 1


def samples(text, name):
    """{sorted (label, value) pairs: sample value} of one series name."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def test_serving_metrics_files_are_merged_into_metrics(sidecar, settings):
    folder = settings.paths.metrics_dir
    for rank, compiles in ((0, 1), (1, 3)):
        serving = ServingMetrics(rank=rank)
        serving.calls.labels("ag_gemm", "tuned", str(rank)).inc(10 + rank)
        serving.request_compiles.labels("ag_gemm", str(rank)).inc(compiles)
        serving.write(folder)
    (folder / "garbage.prom").write_bytes(b"\x00\xffnot {metrics")
    (folder / "serving-rank2.prom.123.456").write_text("half_written_total{")  # a temp file
    code, text = get(sidecar.url + "/metrics")
    assert code == 200
    assert text.count("# TYPE triton_warmup_request_compiles_total counter") == 1  # one family
    compiles = samples(text, "triton_warmup_request_compiles_total")
    assert compiles == {
        (("kernel", "ag_gemm"), ("rank", "0")): 1.0,
        (("kernel", "ag_gemm"), ("rank", "1")): 3.0,
    }
    calls = samples(text, "triton_warmup_serving_calls_total")
    assert sorted(calls.values()) == [10.0, 11.0]
    assert "triton_warmup_ready" in text  # the sidecar's own still there
    serving = ServingMetrics(rank=1)  # a rank rewrites its file: the next scrape sees it
    serving.request_compiles.labels("ag_gemm", "1").inc(5)
    serving.write(folder)
    later = samples(get(sidecar.url + "/metrics")[1], "triton_warmup_request_compiles_total")
    assert later[(("kernel", "ag_gemm"), ("rank", "1"))] == 5.0


def test_a_missing_serving_metrics_folder_is_fine(sidecar, settings):
    assert not settings.paths.metrics_dir.exists()
    code, text = get(sidecar.url + "/metrics")
    assert code == 200 and "triton_warmup_serving" not in text
    assert "triton_warmup_ready" in text


def test_the_run_file_is_exported_once_when_folders_coincide(tmp_path):
    settings = Settings(
        volume=tmp_path / "v", work_dir=tmp_path / "w", manifest=DEMO, metrics_dir=tmp_path / "w"
    )
    RunMetrics().write(settings.paths.run_metrics_file)
    ServingMetrics(rank=0).write(settings.paths.metrics_dir)
    text = Sidecar(settings).metrics_text().decode()
    assert text.count("# TYPE triton_warmup_ranks gauge") == 1
    assert "# TYPE triton_warmup_request_compiles_total counter" in text


def test_the_sidecar_imports_no_torch(tmp_path):
    code = (
        "import sys; from warmup.sidecar.server import Sidecar; from warmup.cli import main; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def make_bundle(tmp_path, name, m, fingerprint=None, artifacts=0):
    store = Store(tmp_path / f"src-{name}", create=True)
    store.put(
        Entry.make(
            "ag_gemm",
            {"M": m, "N": 32, "K": 32},
            fingerprint or cpu_fingerprint(),
            KernelConfig.make({"BLOCK_M": 16}),
        )
    )
    roots = {}
    if artifacts:  # compile artifacts of that many bytes: a bundle that takes a while
        cache = tmp_path / f"cache-{name}" / ("0" * 32)
        cache.mkdir(parents=True)
        (cache / "kernel.cubin").write_bytes(os.urandom(artifacts))
        roots["triton-kernels"] = cache.parent
    out = tmp_path / f"{name}.tgz"
    bundle.create(out, name=name, version="1", entries=store.entries(), roots=roots)
    return out


def reloads(car):
    text = car.metrics_text().decode()
    return {
        s.labels["result"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "triton_warmup_bundle_reloads_total"
    }


def test_bundles_install_while_the_server_keeps_answering(sidecar, settings, tmp_path):
    ready_status(settings)
    answers, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            answers.append(get(sidecar.url + "/readyz")[0])
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        folder = settings.paths.bundle_dir
        shutil.copy(make_bundle(tmp_path, "good", 64), folder / "good.tgz")
        assert wait_for(lambda: len(Store(settings.paths.layout.registry)) == 1)
        generation = os.readlink(settings.paths.layout.registry / "current")
        (folder / "broken.tgz").write_bytes(b"\x1f\x8b not really a bundle")
        shutil.copy(make_bundle(tmp_path, "h200", 96, gpu_fingerprint()), folder / "h200.tgz")
        assert wait_for(lambda: reloads(sidecar).get("rejected") == 2)
        assert os.readlink(settings.paths.layout.registry / "current") == generation  # kept
        assert reloads(sidecar) == {"installed": 1.0, "rejected": 2.0}
    finally:
        stop.set()
        prober.join()
    assert len(answers) > 10 and set(answers) == {200}


def test_a_configmap_data_swap_is_seen(sidecar, settings, tmp_path):
    ready_status(settings)
    folder = settings.paths.bundle_dir  # laid out like a ConfigMap volume
    first = folder / "..2026_11_21_10_00_00.000000001"
    first.mkdir()
    shutil.copy(make_bundle(tmp_path, "v1", 64), first / "fleet.tgz")
    (folder / "..data").symlink_to(first.name)
    (folder / "fleet.tgz").symlink_to("..data/fleet.tgz")
    assert wait_for(lambda: reloads(sidecar).get("installed") == 1)
    second = folder / "..2026_11_21_11_00_00.000000002"
    second.mkdir()
    shutil.copy(make_bundle(tmp_path, "v2", 128), second / "fleet.tgz")
    (folder / "..data_tmp").symlink_to(second.name)
    os.replace(folder / "..data_tmp", folder / "..data")  # what the kubelet does
    assert wait_for(lambda: reloads(sidecar).get("installed") == 2)
    keys = sorted(e.key["M"] for e in Store(settings.paths.layout.registry).entries())
    assert keys == [64, 128]


def test_a_bundle_before_any_warmup_is_deferred_then_installed(sidecar, settings, tmp_path):
    shutil.copy(make_bundle(tmp_path, "early", 64), settings.paths.bundle_dir / "early.tgz")
    assert wait_for(lambda: reloads(sidecar).get("deferred") == 1)
    ready_status(settings)  # records the fingerprint: the watcher retries on its own
    assert wait_for(lambda: reloads(sidecar).get("installed") == 1)
    assert reloads(sidecar) == {"deferred": 1.0, "installed": 1.0}


def scans(car):
    return samples(car.metrics_text().decode(), "triton_warmup_bundle_scans_total")[()]


def test_an_idle_sidecar_scans_once_and_hashes_each_bundle_once(settings, tmp_path, monkeypatch):
    ready_status(settings)
    settings.paths.bundle_dir.mkdir(parents=True)
    shutil.copy(make_bundle(tmp_path, "good", 64), settings.paths.bundle_dir / "good.tgz")
    with running(settings, check_s=0.2) as car:  # many periodic checks in the idle time
        assert wait_for(lambda: reloads(car).get("installed") == 1)
        hashed = []
        real = hashlib.sha256
        monkeypatch.setattr(hashlib, "sha256", lambda *a: hashed.append(a) or real(*a))
        time.sleep(10)  # the install read the bundle and wrote the registry: no event counts
        assert car.watcher.scans == 1 and scans(car) == 1 and hashed == []
        assert (
            reloads(car) == {"installed": 1.0} and len(Store(settings.paths.layout.registry)) == 1
        )


def at_once(n, call, *args):
    """Call ``call(*args)`` from ``n`` threads at once; their results."""
    results = []
    threads = [threading.Thread(target=lambda: results.append(call(*args))) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_probes_parse_the_manifest_once(tmp_path, monkeypatch):
    manifest = tmp_path / "manifest.yaml"
    shutil.copy(DEMO, manifest)
    settings = Settings(volume=tmp_path / "v", work_dir=tmp_path / "w", manifest=manifest)
    parses = []

    def slow_load(path, **options):
        parses.append(path)
        time.sleep(0.5)
        return load_manifest(path, **options)

    monkeypatch.setattr(warmup.sidecar.readiness, "load_manifest", slow_load)
    ready_status(settings)
    with running(settings) as car:
        url = car.url + "/readyz"
        for expected in (1, 2):
            assert [code for code, _ in at_once(8, get, url)] == [200] * 8
            assert len(parses) == expected
            replaced = tmp_path / "new.yaml"  # a ConfigMap swap: same text, a new inode
            shutil.copy(DEMO, replaced)
            os.replace(replaced, manifest)


def test_concurrent_scrapes_share_one_rendering(sidecar):
    class Slow:
        calls = 0

        def collect(self):
            Slow.calls += 1
            time.sleep(0.3)
            return []

    sidecar.metrics.registry.register(Slow())
    codes = [code for code, _ in at_once(8, get, sidecar.url + "/metrics")]
    assert codes == [200] * 8 and Slow.calls <= 2


def test_idle_connections_hold_no_thread(sidecar):
    port = int(sidecar.url.rsplit(":", 1)[1])
    assert get(sidecar.url + "/healthz")[0] == 200  # every worker thread started
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        time.sleep(0.2)
        started = time.monotonic()
        assert get(sidecar.url + "/healthz") == (200, '{"alive": true}')
        assert time.monotonic() - started < 1.0
        assert threading.active_count() <= before + 2
    finally:
        for connection in idle:
            connection.close()


def test_an_error_in_a_handler_answers_500(sidecar, monkeypatch):
    def boom():
        raise RuntimeError("boom")

    monkeypatch.setattr(sidecar, "readiness", boom)
    code, body = get(sidecar.url + "/readyz")
    assert code == 500 and json.loads(body) == {"error": "RuntimeError: boom"}
    assert get(sidecar.url + "/healthz")[0] == 200


@pytest.mark.parametrize(
    "content",
    [
        {"state": "ready", "manifest_digest": "d", "started": 0, "world_size": 1, "failures": 5},
        {"state": "ready", "manifest_digest": "d", "started": 0, "world_size": 1, "shapes": 5},
        "[" * 100_000,
        b"\xff\xfe\x00",
    ],
    ids=["failures-not-a-list", "shapes-not-a-list", "deep-nesting", "not-text"],
)
def test_a_malformed_status_file_reads_as_unreadable(sidecar, settings, content):
    path = settings.paths.status_file
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, body = get(sidecar.url + "/readyz")
    assert code == 503
    assert json.loads(body)["reason"].startswith("the status file is unreadable")


SERVE = (  # triton-warmup, each bundle install 3 s longer: one is in progress at SIGTERM
    "import sys, time; import registry.bundles.bundle as b; real = b.install; "
    "b.install = lambda *a, **k: time.sleep(3) or real(*a, **k); "
    "from warmup.program import entry; entry()"
)


def test_sigterm_stops_a_busy_sidecar_within_2_s(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRITON_WARMUP_")},
        "TRITON_WARMUP_VOLUME": str(tmp_path / "v"),
        "TRITON_WARMUP_WORK_DIR": str(tmp_path / "w"),
        "TRITON_WARMUP_MANIFEST": str(DEMO),
    }
    settings = Settings(volume=tmp_path / "v", work_dir=tmp_path / "w", manifest=DEMO)
    ready_status(settings)
    settings.paths.metrics_dir.mkdir(parents=True)  # a large file: each /metrics parses it
    series = (f'triton_warmup_serving_calls_total{{kernel="k{i}"}} 1.0' for i in range(20_000))
    (settings.paths.metrics_dir / "serving-rank0.prom").write_text(
        "# TYPE triton_warmup_serving_calls_total counter\n" + "\n".join(series) + "\n"
    )
    settings.paths.bundle_dir.mkdir(parents=True)  # a large bundle to install at start
    shutil.copy(make_bundle(tmp_path, "big", 64, artifacts=16 * 2**20), settings.paths.bundle_dir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    stop, idle, probes = threading.Event(), [], []

    def probe(path):
        while not stop.is_set():
            with contextlib.suppress(OSError, http.client.HTTPException):
                get(url + path)

    def connect():
        while len(idle) < 200 and not stop.is_set():
            with contextlib.suppress(OSError):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=1))

    try:
        assert wait_for(lambda: server.poll() is None and probe_ok(url + "/healthz"), 30)
        probes += [threading.Thread(target=probe, args=(p,)) for p in ["/metrics"] * 8]
        probes += [threading.Thread(target=probe, args=(p,)) for p in ["/readyz"] * 4]
        probes.append(threading.Thread(target=connect))  # idle connections
        for thread in probes:
            thread.start()
        time.sleep(1.0)  # probes answering, the bundle installing
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        assert time.monotonic() - started < 2.0 and code == 0  # a clean exit, not the default
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
            server.wait()
        for thread in probes:
            thread.join()
        for connection in idle:
            connection.close()


def probe_ok(url):
    with contextlib.suppress(OSError, http.client.HTTPException):
        return get(url)[0] == 200
    return False


def test_a_restarted_sidecar_neither_reinstalls_a_bundle_nor_undoes_a_rollback(settings, tmp_path):
    ready_status(settings)
    settings.paths.bundle_dir.mkdir(parents=True)
    shutil.copy(make_bundle(tmp_path, "good", 64), settings.paths.bundle_dir / "good.tgz")
    with running(settings) as first:
        assert wait_for(lambda: reloads(first).get("installed") == 1)
    store = Store(settings.paths.layout.registry, create=True)
    store.rollback()
    generations = len(store.generations())
    with running(settings) as second:
        assert wait_for(lambda: reloads(second).get("installed") == 1)
    assert len(Store(settings.paths.layout.registry)) == 0  # once: installed again, rollback undone
    assert len(Store(settings.paths.layout.registry).generations()) == generations


def test_the_sidecar_recovers_the_store_at_start_and_counts_quarantined_files(settings, tmp_path):
    store = Store(settings.paths.layout.registry, create=True)
    store.put(Entry.make("ag_gemm", {"M": 8}, cpu_fingerprint(), KernelConfig.make({"B": 1})))
    gen = settings.paths.layout.registry / os.readlink(settings.paths.layout.registry / "current")
    stale = gen / "ag_gemm" / ".tmp-99-x.json"
    stale.write_text("{")
    (gen / "bad.json").write_text("[1]")
    Store(settings.paths.layout.registry).entries()  # another process quarantines the bad file
    with running(settings) as car:
        assert not stale.exists()
        text = car.metrics_text().decode()
        assert samples(text, "triton_warmup_registry_quarantined")[()] == 1
        recovered = samples(text, "triton_warmup_registry_recovered_total")
        assert sum(recovered.values()) >= 1, text  # the stale temp file, counted


def test_concurrent_probes_read_the_status_file_once(sidecar, settings, monkeypatch):
    ready_status(settings)
    reads = []
    real = RunStatus.read

    def slow_read(path):
        reads.append(path)
        time.sleep(0.3)
        return real(path)

    monkeypatch.setattr(RunStatus, "read", staticmethod(slow_read))
    threads = [threading.Thread(target=sidecar.readiness) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reads) == 1  # once: 8 parses of a file that may be 7 MB
    ready_status(settings, state="failed")
    assert sidecar.readiness()[1]["reason"] == "warmup is failed"  # a new file is read


def test_a_store_that_cannot_take_a_bundle_now_defers_it(sidecar, settings, tmp_path, monkeypatch):
    ready_status(settings)

    def busy(*args, **kwargs):
        raise RegistryError("Store x: write lock not acquired within 120 s.")

    monkeypatch.setattr(bundle, "install", busy)
    path = make_bundle(tmp_path, "good", 64)
    assert sidecar.install_bundle(path) == "deferred"  # once: rejected for good


def test_a_fifo_in_the_metrics_folder_never_blocks_a_scrape(sidecar, settings):
    folder = settings.paths.metrics_dir
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "serving-rank0.prom")
    code, _ = get(sidecar.url + "/metrics")
    assert code == 200


def test_a_bundle_with_a_declared_model_reaches_the_pods_inductor_cache(tmp_path):
    """Hot reload of compiled models: the bundle's index for this manifest's model, at
    its key and this node's fingerprint, is restored into the pod's Inductor cache; one
    for another key stays on the volume only."""
    from registry.caches import inductor_cache
    from tests.warmup.compiled.test_warm import MLP
    from warmup.compiled.key import model_key

    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(MLP)
    settings = Settings(
        volume=tmp_path / "volume", work_dir=tmp_path / "work", manifest=manifest,
        reload_debounce_s=0.1, allow_unsigned=True,  # a compiled model: code
    )  # fmt: skip
    ready_status(settings, manifest_digest=load_manifest(manifest).digest())
    files = {"fxgraph/ab/fabc/entry": b"graph", "ab/cabc.so": b"\x7fELF"}
    cache = tmp_path / "compiled"
    for rel, data in files.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    family, fp = tmp_path / "family", cpu_fingerprint()
    digest = model_key(load_manifest(manifest).model("mlp")).digest
    inductor_cache.save(cache, family, model="mlp", key_digest=digest, key={}, fingerprint=fp)
    other = tmp_path / "other-code"  # the model's artifacts for code this pod does not run
    (other / "fxgraph").mkdir(parents=True)
    (other / "fxgraph" / "stale").write_bytes(b"another key's graph")
    inductor_cache.save(other, family, model="mlp", key_digest="feed" * 8, key={}, fingerprint=fp)
    bundle.create(
        tmp_path / "models.tgz", name="models", version="1", entries=[], roots={"inductor": family}
    )
    with running(settings) as car:
        shutil.copy(tmp_path / "models.tgz", settings.paths.bundle_dir / "models.tgz")
        assert wait_for(lambda: reloads(car).get("installed") == 1)
        reloaded = samples(car.metrics_text().decode(), "triton_warmup_model_reloads_total")
    assert reloaded == {(("model", "mlp"),): 1.0}
    pod = settings.folders.inductor_cache_dir
    assert {
        p.relative_to(pod).as_posix(): p.read_bytes() for p in pod.rglob("*") if p.is_file()
    } == files
    assert len(list(settings.paths.layout.inductor.glob("models/*/*/*/*.json"))) == 2


def exchange(port, data, timeout=3.0):
    """Send ``data`` on a raw connection, then read until the server closes; (the answer,
    seconds from the send to the end of the answer). A reset after an answer keeps it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            connection.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := connection.recv(65536):
                answer += chunk
        return answer, time.monotonic() - started


def status_line(answer):
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def headers_of(answer):
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value.strip() for name, value in (h.split(":", 1) for h in head)}


LONG = b"x" * 70_000


@pytest.mark.parametrize(
    "request_bytes,expected",
    [
        (b"GET /" + LONG + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),
        (b"GET /" + LONG, 414),  # no line end at all
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + LONG + b"\r\n\r\n", 431),
        (b"GET /\r\n", 400),  # HTTP/0.9: no version, no headers
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n", 400),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET  /healthz  HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400),  # 1.1 without Host
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n", 400),
        (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
        (b"POST /healthz HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi", 405),
    ],
    ids=[
        "long-request-line", "long-line-unended", "long-header", "http-0.9", "tls-hello",
        "garbage", "double-spaces", "no-host", "header-without-colon", "http-2", "post",
    ],
)  # fmt: skip
def test_malformed_requests_get_a_proper_status_line_at_once(sidecar, request_bytes, expected):
    port = int(sidecar.url.rsplit(":", 1)[1])
    answer, seconds = exchange(port, request_bytes)
    # the code, not the reason phrase: Python's, and 414's changed in 3.13
    assert status_line(answer).split(" ")[:2] == ["HTTP/1.1", str(expected)]
    assert seconds < 1.0
    headers = headers_of(answer)
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert headers["content-type"] == "application/json" and json.loads(body)["error"]
    assert int(headers["content-length"]) == len(body) and headers["connection"] == "close"
    if expected == 405:
        assert headers["allow"] == "GET, HEAD"
    assert get(sidecar.url + "/healthz")[0] == 200  # and the server goes on


def test_head_answers_the_headers_of_get_without_the_body(sidecar):
    port = int(sidecar.url.rsplit(":", 1)[1])
    answer, _ = exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    assert status_line(answer) == "HTTP/1.1 200 OK" and answer.endswith(b"\r\n\r\n")
    assert headers_of(answer)["content-length"] == str(len(b'{"alive": true}'))


def test_a_query_string_is_not_part_of_the_path(sidecar):
    assert get(sidecar.url + "/healthz?verbose=1") == (200, '{"alive": true}')


@pytest.mark.parametrize("version", ["1.2", "2.0"])
def test_head_with_an_unsupported_version_gets_505_without_a_body(sidecar, version):
    port = int(sidecar.url.rsplit(":", 1)[1])
    answer, seconds = exchange(port, f"HEAD / HTTP/{version}\r\n\r\n".encode())
    assert status_line(answer).split(" ")[:2] == ["HTTP/1.1", "505"] and seconds < 1.0
    assert answer.endswith(b"\r\n\r\n") and int(headers_of(answer)["content-length"]) > 0
    assert get(sidecar.url + "/healthz")[0] == 200


def test_a_readyz_flood_still_gives_a_probe_the_last_verdict_at_once(settings, monkeypatch):
    pool = dataclasses.replace(Sidecar.POOLS["/readyz"], reuse_s=30.0)  # a loaded machine
    monkeypatch.setattr(Sidecar, "POOLS", {**Sidecar.POOLS, "/readyz": pool})
    ready_status(settings)
    with running(settings) as car:
        assert get(car.url + "/readyz")[0] == 200  # the verdict, computed
        release, real = threading.Event(), car.readiness
        monkeypatch.setattr(car, "readiness", lambda: release.wait(10) and real())
        port = int(car.url.rsplit(":", 1)[1])
        flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(4 + 64)]
        try:
            for connection in flood:  # every thread busy, every queued place taken
                connection.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
            time.sleep(0.3)
            started = time.monotonic()
            code, body = get(car.url + "/readyz")
            assert code == 200 and json.loads(body)["ready"] is True
            assert time.monotonic() - started < 0.5
        finally:
            release.set()
            for connection in flood:
                connection.close()


def test_with_trusted_keys_the_watcher_installs_only_what_a_trusted_key_signed(
    settings, tmp_path, caplog
):
    from registry.trust import signing

    trusted, _ = signing.generate(tmp_path / "trusted", "fleet")
    foreign, _ = signing.generate(tmp_path / "foreign", "stranger")
    settings = settings.updated(trusted_keys=tmp_path / "trusted")
    ready_status(settings)
    unsigned = make_bundle(tmp_path, "unsigned", 32)
    strange = bundle.sign(make_bundle(tmp_path, "strange", 48), signing.SigningKey.load(foreign))
    good = bundle.sign(make_bundle(tmp_path, "good", 64), signing.SigningKey.load(trusted))
    with running(settings) as car:
        folder = settings.paths.bundle_dir
        shutil.copy(unsigned, folder / "unsigned.tgz")
        shutil.copy(strange.path, folder / "strange.tgz")
        assert wait_for(lambda: reloads(car).get("rejected") == 2)
        assert len(car.store) == 0 and bundle.installed(car.store) == []
        shutil.copy(good.path, folder / "good.tgz")
        assert wait_for(lambda: reloads(car).get("installed") == 1)
    assert [e.key["M"] for e in Store(settings.paths.layout.registry).entries()] == [64]
    refused = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert any("unsigned.tgz" in m and "unsigned" in m for m in refused)
    assert any("strange.tgz" in m and f"unknown key {strange.signed_by}" in m for m in refused)


def test_a_trusted_keys_folder_that_is_not_there_fails_the_start(settings, tmp_path):
    from registry.trust.signing import KeyFileError

    with pytest.raises(KeyFileError, match="does not exist"):
        Sidecar(settings.updated(trusted_keys=tmp_path / "typo"))
