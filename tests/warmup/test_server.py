"""The sidecar: probes, metrics, and bundles installed while it keeps answering."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from registry import Entry, KernelConfig, Store, bundle, cpu_fingerprint
from tests.conftest import gpu_fingerprint
from warmup.manifest import load_manifest
from warmup.metrics import RunMetrics, ServingMetrics
from warmup.results import RunStatus, ShapeResult
from warmup.server import Sidecar
from warmup.settings import Settings

ROOT = Path(__file__).parents[2]
DEMO = ROOT / "examples" / "demo.yaml"


@pytest.fixture
def settings(tmp_path):
    return Settings(
        volume=tmp_path / "volume", work_dir=tmp_path / "work", manifest=DEMO, reload_debounce_s=0.1
    )


@pytest.fixture
def sidecar(settings):
    car = Sidecar(settings)
    port = car.start(host="127.0.0.1", port=0)
    car.url = f"http://127.0.0.1:{port}"
    yield car
    car.stop()


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
    RunStatus(**fields).write(settings.status_path)


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
        "manifest": load_manifest(DEMO).digest(),
        "registry_entries": 0,
        "shapes": 6,
    }


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
    run.write(settings.metrics_path)
    code, text = get(sidecar.url + "/metrics")
    names = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert code == 200
    assert names["triton_warmup_tuning_seconds_count"] == 2  # the run's numbers
    assert names["triton_warmup_ranks"] == 2
    assert "triton_warmup_ready" in names and "triton_warmup_registry_entries" in names


def samples(text, name):
    """{sorted (label, value) pairs: sample value} of one series name."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def test_serving_metrics_files_are_merged_into_metrics(sidecar, settings):
    folder = settings.serving_metrics_path
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
    assert not settings.serving_metrics_path.exists()
    code, text = get(sidecar.url + "/metrics")
    assert code == 200 and "triton_warmup_serving" not in text
    assert "triton_warmup_ready" in text


def test_the_run_file_is_exported_once_when_folders_coincide(tmp_path):
    settings = Settings(
        volume=tmp_path / "v", work_dir=tmp_path / "w", manifest=DEMO, metrics_dir=tmp_path / "w"
    )
    RunMetrics().write(settings.metrics_path)
    ServingMetrics(rank=0).write(settings.serving_metrics_path)
    text = Sidecar(settings).metrics_text().decode()
    assert text.count("# TYPE triton_warmup_ranks gauge") == 1
    assert "# TYPE triton_warmup_request_compiles_total counter" in text


def test_the_sidecar_imports_no_torch(tmp_path):
    code = (
        "import sys; from warmup.server import Sidecar; from warmup.cli import main; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def make_bundle(tmp_path, name, m, fingerprint=None):
    store = Store(tmp_path / f"src-{name}")
    store.put(
        Entry.make(
            "ag_gemm",
            {"M": m, "N": 32, "K": 32},
            fingerprint or cpu_fingerprint(),
            KernelConfig.make({"BLOCK_M": 16}),
        )
    )
    out = tmp_path / f"{name}.tgz"
    bundle.create(out, name=name, version="1", entries=store.entries())
    return out


def wait_for(predicate, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


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
        folder = settings.bundles
        shutil.copy(make_bundle(tmp_path, "good", 64), folder / "good.tgz")
        assert wait_for(lambda: len(Store(settings.paths.registry)) == 1)
        generation = os.readlink(settings.paths.registry / "current")
        (folder / "broken.tgz").write_bytes(b"\x1f\x8b not really a bundle")
        shutil.copy(make_bundle(tmp_path, "h200", 96, gpu_fingerprint()), folder / "h200.tgz")
        assert wait_for(lambda: reloads(sidecar).get("rejected") == 2)
        assert os.readlink(settings.paths.registry / "current") == generation  # kept
        assert reloads(sidecar) == {"installed": 1.0, "rejected": 2.0}
    finally:
        stop.set()
        prober.join()
    assert len(answers) > 10 and set(answers) == {200}


def test_a_configmap_data_swap_is_seen(sidecar, settings, tmp_path):
    ready_status(settings)
    folder = settings.bundles  # laid out like a ConfigMap volume
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
    keys = sorted(e.key["M"] for e in Store(settings.paths.registry).entries())
    assert keys == [64, 128]


def test_a_bundle_before_any_warmup_is_deferred_then_installed(sidecar, settings, tmp_path):
    shutil.copy(make_bundle(tmp_path, "early", 64), settings.bundles / "early.tgz")
    assert wait_for(lambda: reloads(sidecar).get("deferred") == 1)
    ready_status(settings)
    sidecar.watcher.scan()
    assert reloads(sidecar).get("installed") == 1
