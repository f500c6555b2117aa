"""The run's summary line (``warmup.cli.summary``), as ``run`` and ``status`` print it for
a person who has not read the source: what it counts, said in words."""

from __future__ import annotations

from warmup.cli import summary
from warmup.core.results import RunStatus, ShapeResult

SHAPES = ({"M": 32, "N": 32, "K": 32}, {"M": 64, "N": 48, "K": 32}, {"M": 48, "N": 40, "K": 64})


def _status(shapes: list[ShapeResult], **fields) -> RunStatus:
    base = {"state": "ready", "manifest_digest": "d", "started": 0.0, "world_size": 2}
    return RunStatus(**{**base, "duration_s": 1.0, "shapes": shapes, **fields})


def _results(source: str, ranks: tuple[int, ...]) -> list[ShapeResult]:
    return [
        ShapeResult(kernel="ag_gemm", key={**shape, "world": 2}, rank=rank, source=source)
        for rank in ranks
        for shape in SHAPES
    ]


def test_a_run_of_two_ranks_and_a_full_hit_of_the_same_shapes_count_alike():
    # The ranks report a result each (6); a full hit starts no rank and has one per shape
    # (3). Both are 3 shapes for 2 ranks: the summary must not say 6, then 3.
    warmed = summary(_status(_results("tuned", (0, 1)), benchmark_runs=342))
    hit = summary(_status(_results("registry", (0,)), full_hit=True))
    assert warmed.startswith("warmup ready: 3 kernel shapes for 2 ranks (3 tuned), 342 bench")
    assert hit.startswith("warmup ready: 3 kernel shapes for 2 ranks (3 found in the registry)")
    assert "nothing benchmarked" in hit and "0 benchmark runs" not in hit
    assert hit.endswith("; a full hit: caches restored for the server, no rank started")
    assert "shape-rank" not in warmed + hit


def test_a_shape_failed_on_one_rank_counts_as_failed_once():
    results = _results("tuned", (0, 1))
    results[4] = results[4].model_copy(update={"source": "failed", "error": "no config fit"})
    line = summary(_status(results, state="failed")).splitlines()[0]
    assert line.startswith("warmup failed: 3 kernel shapes for 2 ranks (1 failed, 2 tuned)")


def test_one_of_each_is_singular_and_a_newer_source_is_named_as_written():
    one = [ShapeResult(kernel="k", key={"M": 8}, source="nearest", benchmark_runs=0)]
    line = summary(_status(one, world_size=1, benchmark_runs=1))
    assert line.startswith("warmup ready: 1 kernel shape for 1 rank (1 nearest), 1 benchmark run ")


def test_a_manifest_of_models_only_says_it_has_no_kernel_shape():
    line = summary(_status([]))
    assert line.startswith("warmup ready: 0 kernel shapes for 2 ranks, nothing benchmarked, ready")
