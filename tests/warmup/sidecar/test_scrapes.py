"""/metrics: the sidecar's metrics with the run's and the serving processes' files."""

import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from registry.storage.store import Store
from warmup.core.metrics import ServeMetrics
from warmup.core.settings import Settings
from warmup.sidecar import scrapes
from warmup.sidecar.scrapes import Scrapes


@pytest.fixture
def settings(tmp_path):
    return Settings(volume=tmp_path / "volume", work_dir=tmp_path / "work")


def _scrapes(settings):
    metrics = ServeMetrics(registry=CollectorRegistry())
    return Scrapes(settings, metrics, Store(settings.paths.registry_dir, create=True))


def test_a_rendering_holds_the_stores_gauges_and_the_run_and_serving_files(settings, make_entry):
    paths = settings.paths
    paths.metrics_dir.mkdir(parents=True, exist_ok=True)
    paths.run_metrics_file.write_text("triton_warmup_run_marker 3.0\n")
    (paths.metrics_dir / "serving-0.prom").write_text("triton_warmup_serving_marker 5.0\n")
    export = _scrapes(settings)
    export.store.put(make_entry(m=1))
    text = export.text().decode()
    assert "triton_warmup_registry_entries 1.0" in text
    assert "triton_warmup_run_marker 3.0" in text and "triton_warmup_serving_marker 5.0" in text


def test_a_scrape_takes_a_rendering_begun_after_it_arrived(settings):
    export = _scrapes(settings)
    first = export.text()
    export.metrics.ready.set(1)
    assert export.text() != first  # a later scrape renders again


def test_a_scrape_that_waits_too_long_for_another_says_so(settings, monkeypatch):
    export = _scrapes(settings)
    monkeypatch.setattr(scrapes, "SCRAPE_WAIT_S", 0.05)
    held = threading.Event()

    def hold():
        with export._lock:
            held.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    with pytest.raises(TimeoutError, match="another scrape has rendered"):
        export.text()
    holder.join()
