"""The run's end: the ranks' reports and the launcher's view (one ``RunRecord``) summed
into the status and the metrics; the caches saved."""

import json
import shutil
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from registry.core.fingerprint import cpu_fingerprint
from tests.conftest import DEMO, settings_for, write_manifest
from warmup.core.manifest import load_manifest
from warmup.core.results import RankFailure, RankReport, RunStatus
from warmup.core.services import Services
from warmup.run.aggregate import RunRecord, _save_caches, finish

MANIFEST = """
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}
"""


def _two_empty_reports(tmp_path):
    """The record of a 2-rank DEMO run whose ranks 0 and 1 reported no shape."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for rank in (0, 1):
        RankReport(rank=rank, world=2).write(run_dir)
    settings = settings_for(tmp_path)
    return RunRecord(
        services=Services(settings),
        manifest=load_manifest(DEMO),
        run_dir=run_dir,
        world=2,
        started=0.0,
    )


def test_ranks_that_warmed_fewer_shapes_than_the_manifest_are_not_ready(tmp_path):
    record = _two_empty_reports(tmp_path)
    status = finish(record)
    assert status.state == "failed" and not status.ready
    assert status.failures == [
        "rank 0 reported 0 of 3 shapes",
        "rank 1 reported 0 of 3 shapes",
    ]
    status = finish(replace(record, run_dir=tmp_path / "empty"))
    assert status.failures == ["rank 0 reported nothing", "rank 1 reported nothing"]
    assert RunStatus.read(record.settings.paths.status_file) == status


def test_the_ranks_exit_is_timed_from_their_reports_on_the_pod_s_clock(tmp_path):
    record = _two_empty_reports(tmp_path)
    assert record.run_dir is not None
    written = [r.written for r in RankReport.read_all(record.run_dir)]
    assert all(time.time() - 60 < w <= time.time() for w in written)
    status = finish(replace(record, ranks_ended=max(written) + 1.5))
    assert status.phases["exit"] == pytest.approx(1.5, abs=1e-3)
    # reports of an older writer say no time: no exit phase rather than a wrong one
    for rank in (0, 1):
        (record.run_dir / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "world": 2}))
    status = finish(replace(record, ranks_ended=time.time()))
    assert "exit" not in status.phases


def test_what_the_launcher_saw_reaches_the_status_and_the_metrics(tmp_path):
    record = replace(
        _two_empty_reports(tmp_path),
        rank_failures=(RankFailure(rank=1, end="exited", code=3),),
        errors=("the run exceeded its time limit of 5 s",),
        phases={"imports": 0.25, "restore": 0.5},
        recovered={"temp_files": 2},
    )
    status = finish(record)
    assert status.errors[0] == "the run exceeded its time limit of 5 s"
    assert [str(f) for f in status.rank_failures] == ["rank 1 exited with code 3"]
    assert status.phases["imports"] == 0.25 and status.phases["restore"] == 0.5
    assert "save" in status.phases  # the aggregation's own, beside the launcher's
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(
            record.settings.paths.run_metrics_file.read_text()
        )
        for s in family.samples
    }
    assert found["triton_warmup_run_recovered_total", (("what", "temp_files"),)] == 2
    assert found["triton_warmup_ranks", ()] == 2


def test_the_runs_end_saves_a_declared_folder_and_restores_it_for_the_next_pod(tmp_path):
    engine = tmp_path / "engine"
    text = MANIFEST + f'caches:\n  - {{name: vllm, path: "{engine}", key: "qwen tp1"}}\n'
    manifest = load_manifest(write_manifest(tmp_path / "m.yaml", text))
    settings = settings_for(tmp_path)
    settings.paths.layout.registry.mkdir(parents=True)
    (engine / "compiled").mkdir(parents=True)
    (engine / "compiled" / "graph.py").write_bytes(b"made by the engine")
    report = SimpleNamespace(fingerprint=cpu_fingerprint().to_json())
    saved = _save_caches(Services(settings, run=True), manifest, [report])
    assert saved.copied == 1
    shutil.rmtree(engine)  # the next pod: a fresh folder
    _save_caches(Services(settings, run=True), manifest, [report])
    assert (engine / "compiled" / "graph.py").read_bytes() == b"made by the engine"
