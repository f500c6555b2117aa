"""The fleet bench's reading of a pod and its sharing floor: what shape-by-shape sharing
can reach at best, from the solo pod's own per-shape tuning times."""

import pytest

from bench.fleet import Mode, Pod, read_pod, report, sharing_floor, target
from warmup.core.results import RunStatus, ShapeResult


def _shape(m, source, seconds, rank=0):
    key = {"M": m, "N": 64, "K": 32, "dtype": "fp32", "world": 2}
    return ShapeResult(kernel="ag_gemm", key=key, rank=rank, source=source, seconds=seconds)


def test_a_pod_keeps_each_tuned_shapes_time_the_slowest_rank_took(tmp_path):
    shapes = [
        _shape(64, "tuned", 2.0, rank=0),
        _shape(64, "tuned", 2.5, rank=1),
        _shape(128, "registry", 0.01, rank=0),
        _shape(128, "registry", 0.02, rank=1),
    ]
    RunStatus(state="ready", manifest_digest="d", started=0.0, world_size=2, shapes=shapes).write(
        tmp_path / "status.json"
    )
    pod = read_pod(3, tmp_path, 5.0, 0, ranks=2)
    assert pod.state == "ready" and pod.tuned == 1  # two shape-rank rows over two ranks
    assert pod.tuned_s == {"ag_gemm M=64 N=64 K=32": 2.5}


def _solo(seconds, *tunings):
    return Pod(
        0, seconds, 0, "ready", len(tunings), tuned_s={str(i): t for i, t in enumerate(tunings)}
    )


def test_the_sharing_floor_is_the_costliest_shape_or_an_even_split():
    # 30 s solo, 26 s of it tuning: 8 s for the costliest shape
    solo = _solo(30.0, 8.0, 6.0, 5.0, 4.0, 3.0)
    two, four = sharing_floor(solo, 2), sharing_floor(solo, 4)
    assert two["fixed_s"] == 4.0 and two["tuning_s"] == 26.0
    assert two["floor_s"] == 4.0 + 13.0  # the even split is longer than the costliest shape
    assert four["floor_s"] == 4.0 + 8.0  # no pod can finish before the costliest shape
    assert four["floor_over_solo"] == pytest.approx(0.4)
    assert four["floor_over_solo"] > target(4, 1)  # such a manifest cannot meet 0.35x
    assert sharing_floor(_solo(30.0), 4) is None  # the solo pod tuned nothing


def test_the_report_gives_the_fleet_modes_the_floor_from_the_solo_run(capsys):
    solo = Mode("solo", [_solo(30.0, 8.0, 6.0, 5.0, 4.0, 3.0)])
    fleet = Mode("volume", [Pod(i, 12.5, 0, "ready", 1) for i in range(4)])
    fleet.pods[0].tuned = 2  # 2 + 1 + 1 + 1 = 5 shapes, each once
    checks = report([solo, fleet], 5, 4, 1, bound=0.35)
    assert "sharing_floor" not in checks["solo"]
    assert checks["volume"]["sharing_floor"]["floor_s"] == 12.0
    assert checks["volume"]["target_met"] is False  # 12.5 / 30 > 0.35
    assert "= 12.00 s, 0.40x solo (target 0.35x)" in capsys.readouterr().out
    not_ready = Mode("solo", [Pod(0, 30.0, 1, "failed", 0, tuned_s={"a": 8.0})])
    assert "sharing_floor" not in report([not_ready, fleet], 5, 4, 1, bound=0.35)["volume"]
