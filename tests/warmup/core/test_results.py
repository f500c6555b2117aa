"""The typed records a run passes between processes, and what the metrics count of them."""

import json
import random
import time

import pytest

from registry import cpu_fingerprint
from tests.spoil import MUTATIONS
from warmup.core.metrics import RunMetrics
from warmup.core.results import ModelResult, RankFailure, RankReport, RunStatus, ShapeResult


def shape(source, **extra):
    return ShapeResult(kernel="k", key={"M": 8, "N": 4, "K": 4}, source=source, **extra)


def counts(metrics):
    """{(counter sample, its source label): value}, read from the metrics' registry."""
    samples = (s for family in metrics.registry.collect() for s in family.samples)
    return {
        (s.name, s.labels.get("source", "")): s.value for s in samples if s.name.endswith("_total")
    }


def test_metrics_count_each_kind_of_result_from_its_fields():
    metrics = RunMetrics()
    metrics.record(
        [
            shape("registry", compile_seconds=0.1),
            shape("bundle", compile_seconds=0.1),
            shape("tuned", seconds=2.0),
            shape("tuned", seconds=2.0, unlocked=True),  # rank 0's row counts
            shape("tuned", seconds=2.0, unlocked=True, rank=1),
            shape("fallback"),
            shape("user"),
            shape("user", error="RuntimeError: boom"),
            shape("failed", error="no candidate ran"),
            shape("registry", compile_seconds=0.1, error="stored config failed its check"),
        ]
    )
    found = counts(metrics)
    assert found[("triton_warmup_cache_hits_total", "registry")] == 2
    assert found[("triton_warmup_cache_hits_total", "bundle")] == 1
    assert found[("triton_warmup_cache_misses_total", "")] == 4  # tuned and fallback only
    assert found[("triton_warmup_unlocked_tunings_total", "")] == 1
    assert found[("triton_warmup_user_shapes_total", "")] == 2
    assert found[("triton_warmup_failed_shapes_total", "")] == 3
    assert found[("triton_warmup_fallbacks_total", "")] == 1


def test_a_rank_report_round_trips_through_its_file(tmp_path):
    report = RankReport(rank=1, world=2, shapes=[shape("tuned", rank=1)])
    report.write(tmp_path)
    RankReport(rank=0, world=2).write(tmp_path)
    assert [r.rank for r in RankReport.read_all(tmp_path)] == [0, 1]
    read = RankReport.read_all(tmp_path)[1]
    assert 0 < time.time() - read.written < 60  # dated when written, on this clock
    assert read.model_copy(update={"written": report.written}) == report


def test_status_derives_sources_and_one_line_per_failure(tmp_path):
    status = RunStatus(
        state="failed",
        manifest_digest="d",
        started=0.0,
        world_size=2,
        errors=["the run exceeded its time limit of 5 s"],
        rank_failures=[RankFailure(rank=1, end="exited", code=-9)],
        shapes=[shape("tuned"), shape("failed", rank=1, error="no candidate ran")],
    )
    assert status.sources == {"failed": 1, "tuned": 1}
    assert status.failures == [
        "the run exceeded its time limit of 5 s",
        "rank 1 exited with code -9",
        "k M=8 N=4 K=4 (rank 1): no candidate ran",
    ]
    path = status.write(tmp_path / "status.json") and tmp_path / "status.json"
    on_disk = json.loads(path.read_text())
    assert on_disk["sources"] == status.sources and on_disk["failures"] == status.failures
    assert RunStatus.read(path) == status


def test_shape_sources_count_each_shape_once_whatever_its_ranks():
    # 2 shapes on 2 ranks: 4 results, 2 shapes; the one that failed on rank 1 is failed
    other = shape("tuned").model_copy(update={"key": {"M": 16, "N": 4, "K": 4}})
    failed = other.model_copy(update={"rank": 1, "source": "failed", "error": "no candidate"})
    shapes = [shape("tuned"), shape("tuned", rank=1), other, failed]
    status = RunStatus(
        state="failed", manifest_digest="d", started=0.0, world_size=2, shapes=shapes
    )
    assert status.sources == {"failed": 1, "tuned": 3}  # a result per shape and rank
    assert status.shape_sources == {"failed": 1, "tuned": 1}
    assert "shape_sources" not in status.model_dump()  # derived, not written


def test_an_unreadable_or_foreign_status_reads_as_none(tmp_path):
    path = tmp_path / "status.json"
    assert RunStatus.read(path) is None
    path.write_text("{not json")
    assert RunStatus.read(path) is None
    path.write_text(json.dumps({"state": "ready"}))  # no digest, no world size
    assert RunStatus.read(path) is None
    path.write_text(
        json.dumps({"state": "done", "manifest_digest": "d", "started": 0, "world_size": 1})
    )
    assert RunStatus.read(path) is None


def test_a_status_from_another_version_still_reads(tmp_path):
    path = tmp_path / "status.json"
    newer = {
        "state": "ready",
        "manifest_digest": "d",
        "started": 0,
        "world_size": 1,
        "phases": {"restore": 1.0},  # a field this version does not know
        "shapes": [{"kernel": "k", "key": {"M": 8}, "source": "nearest", "extra": 1}],
    }
    path.write_text(json.dumps(newer))
    status = RunStatus.read(path)
    assert status is not None and status.ready and status.sources == {"nearest": 1}
    older = {  # failures as strings, null times
        "state": "failed",
        "manifest_digest": "d",
        "started": 0,
        "world_size": 1,
        "failures": ["rank 1 exited with code -9"],
        "shapes": [{"kernel": "k", "key": {"M": 8}, "source": "failed", "seconds": None}],
    }
    path.write_text(json.dumps(older))
    status = RunStatus.read(path)
    assert status is not None and status.failures == ["rank 1 exited with code -9"]
    assert status.shapes[0].seconds == 0.0


VALID = {"state": "ready", "manifest_digest": "d", "started": 0, "world_size": 1}


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({**VALID, "failures": 5}),
        json.dumps({**VALID, "failures": {"a": 1}}),
        json.dumps({**VALID, "errors": [1, 2]}),
        json.dumps({**VALID, "shapes": [{"kernel": "k", "key": 5, "source": "tuned"}]}),
        json.dumps({**VALID, "shapes": 5}),
        json.dumps({**VALID, "rank_failures": [{"rank": "x", "end": "exited"}]}),
        json.dumps({**VALID, "started": {"nested": [[[]]]}}),
        json.dumps([VALID]),
        "null",
        "5",
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        "\udcff",
    ],
    ids=[
        "failures-a-number",
        "failures-a-dict",
        "errors-not-strings",
        "shape-key-a-number",
        "shapes-a-number",
        "rank-not-a-number",
        "started-a-dict",
        "a-list",
        "null",
        "a-number",
        "deep-lists",
        "deep-objects",
        "not-utf8",
    ],
)
def test_a_malformed_status_reads_as_none_and_never_raises(tmp_path, content):
    path = tmp_path / "status.json"
    path.write_bytes(content.encode(errors="surrogateescape"))
    assert RunStatus.read(path) is None


def test_a_status_folder_in_place_of_the_file_reads_as_none(tmp_path):
    (tmp_path / "status.json").mkdir()
    assert RunStatus.read(tmp_path / "status.json") is None


def test_two_thousand_spoiled_status_files_each_read_as_a_status_or_none(tmp_path):
    shape = ShapeResult(kernel="ag_gemm", key={"M": 8, "N": 16}, source="tuned", seconds=1.5)
    full = RunStatus(
        **{**VALID, "state": "failed"},
        fingerprint=cpu_fingerprint().to_json(),
        errors=["the time limit"],
        rank_failures=[RankFailure(rank=1, end="exited", code=-9)],
        skipped_entries=["entries.1 (ag_gemm, world size 8)"],
        shapes=[shape, shape.model_copy(update={"source": "failed", "error": "boom"})],
    )
    path = tmp_path / "status.json"
    healthy = full.write(path).model_dump_json(indent=1).encode()
    rng = random.Random(20261123)
    kinds: dict[str, int] = {}
    for case in range(2000):
        name, mutate = rng.choice(list(MUTATIONS.items()))
        path.write_bytes(mutate(healthy, rng))
        status = RunStatus.read(path)  # once: a TypeError or a RecursionError out of the probe
        kinds[name] = kinds.get(name, 0) + 1
        if status is not None:  # whatever it read is a status the probe can answer from
            assert isinstance(status.failures, list) and isinstance(status.ready, bool), case
    assert len(kinds) == len(MUTATIONS)


@pytest.mark.parametrize(
    "restore,stored,said",
    [
        ("miss: none stored", 26, "; no artifacts restored (none stored), 26 stored now"),
        ("hit", 0, "; artifacts restored, none stored now"),
        (
            "hit (1 artifacts recompiled)",
            3,
            "; artifacts restored (1 artifacts recompiled), 3 stored now",
        ),
        (
            "failed: OSError: gone",
            4,
            "; artifacts not restored: the restore failed (OSError: gone), 4 stored now",
        ),
        ("", 0, ""),  # another rank's: rank 0 restores and stores
    ],
)
def test_a_warm_models_line_says_what_was_restored_and_what_is_stored_now(restore, stored, said):
    # ``restore`` is the outcome before the compile, not what is stored after it
    model = ModelResult(name="m", phase="warm", restore=restore, stored_artifacts=stored)
    line = model.describe()
    assert line.startswith("model m: warm (0 shapes, 0 graphs compiled, 0 cache hits) in 0.00 s")
    assert line.endswith(f" s{said}") and "stored artifacts:" not in line


def test_a_model_says_whether_it_is_packaged_or_why_not():
    from warmup.core.results import ModelResult

    packaged = ModelResult(name="m", phase="packaged", package="made in 31.2 s", seconds=32.0)
    assert packaged.describe() == "model m: packaged for the server in 32.00 s (made in 31.2 s)"
    assert not packaged.failed
    fell_back = ModelResult(name="m", phase="deferred", package="failed (export): a branch")
    assert fell_back.describe().endswith("; no package: failed (export): a branch")
