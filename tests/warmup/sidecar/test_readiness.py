"""The verdict of /readyz, read from the manifest, the status file and the registry."""

import os
import shutil

import pytest
from prometheus_client import CollectorRegistry

from registry.storage.store import Store
from tests.warmup.sidecar.test_server import DEMO, ready_status
from warmup.core.manifest import ManifestError
from warmup.core.metrics import ServeMetrics
from warmup.core.results import ServerWarm
from warmup.core.settings import Settings
from warmup.sidecar.readiness import ByStat, Readiness


@pytest.fixture
def settings(tmp_path):
    return Settings(volume=tmp_path / "volume", work_dir=tmp_path / "work", manifest=DEMO)


def _readiness(settings):
    metrics = ServeMetrics(registry=CollectorRegistry())
    return Readiness(settings, metrics, Store(settings.paths.registry_dir, create=True))


def test_ready_once_the_status_file_says_this_manifests_warmup_completed(settings):
    readiness = _readiness(settings)
    ready, body = readiness.verdict()
    assert not ready and body["reason"] == "no warmup has run yet"
    assert readiness.metrics.ready._value.get() == 0
    ready_status(settings)
    ready, body = readiness.verdict()
    assert ready and body["registry_entries"] == 0 and body["shapes"] == 6
    assert readiness.metrics.ready._value.get() == 1
    assert readiness.status().state == "ready"


def test_a_warmup_for_another_manifest_or_one_that_failed_is_not_ready(settings):
    readiness = _readiness(settings)
    ready_status(settings, manifest_digest="other")
    ready, body = readiness.verdict()
    assert not ready and body["found"] == "other"
    assert body["expected"] == readiness.manifest_digest()
    ready_status(settings, state="failed")
    assert readiness.verdict()[1]["reason"] == "warmup is failed"


def test_with_ready_after_server_it_waits_for_that_many_warm_ranks(settings):
    settings = settings.updated(ready_after_server=2)
    readiness = _readiness(settings)
    ready_status(settings)
    assert "0 of 2 ranks" in readiness.verdict()[1]["reason"]
    for rank in (0, 1):
        digest = readiness.manifest_digest()
        ServerWarm(rank=str(rank), manifest_digest=digest, declared=0.0).write(
            settings.paths.metrics_dir
        )
    assert readiness.verdict()[0]


def test_an_invalid_manifest_raises_a_fresh_error_and_is_logged_at_start(tmp_path, caplog):
    bad = tmp_path / "bad.yaml"
    bad.write_text("entries: 7\n")
    readiness = _readiness(Settings(volume=tmp_path / "v", work_dir=tmp_path / "w", manifest=bad))
    with pytest.raises(ManifestError) as first:
        readiness.manifest_digest()
    with pytest.raises(ManifestError) as second:
        readiness.manifest_digest()
    assert first.value is not second.value and first.value.errors == second.value.errors
    assert readiness.verdict()[1]["reason"] == "manifest is invalid"
    readiness.check_manifest()
    assert "/readyz answers 503 until the manifest is fixed" in caplog.text


def test_by_stat_parses_again_only_when_the_file_changes_or_is_absent(tmp_path):
    path, parses = tmp_path / "f", []
    held = ByStat(lambda p: parses.append(p) or len(parses))
    assert held.get(path) == (None, 1) and held.get(path) == (None, 2)  # absent: every time
    shutil.copy(DEMO, path)
    key, parsed = held.get(path)
    assert key is not None and parsed == 3 and held.get(path) == (key, 3)
    shutil.copy(DEMO, tmp_path / "g")
    os.replace(tmp_path / "g", path)  # a ConfigMap swap: same text, a new inode
    assert held.get(path)[1] == 4
