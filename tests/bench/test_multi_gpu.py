"""The multi-GPU driver: refuses a world it cannot run, runs each stage's benches at N
ranks with their flags and --out, keeps going past a failed bench, and judges what the
others wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "multi_gpu.sh"

# A fake python: a bench call is recorded and writes a fleet result to its --out (or fails
# when its name is in FAIL); bench/targets.py runs for real.
FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, subprocess, sys
args = sys.argv[1:]
if args and args[0].endswith("targets.py"):
    sys.exit(subprocess.run([os.environ["REAL_PYTHON"], *args]).returncode)
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps([os.environ.get("CUDA_VISIBLE_DEVICES"), *args]) + "\\n")
out = args[args.index("--out") + 1]
if any(name in out for name in os.environ.get("FAIL", "").split(",") if name):
    print("boom", file=sys.stderr)
    sys.exit(3)
mode = {"all_ready": True, "tuned_in_fleet": 2, "tuned_once": True, "slowest_s": 3.0,
        "slowest_over_solo": 0.3, "target": 0.6, "target_met": True}
result = {"pods": 2, "ranks": 1, "device": "cuda", "gpus": ["0", "1"],
          "shapes": [[1, 1, 1]] * 2, "shared_gpus": False, "modes": {"volume": mode}}
open(out, "w").write(json.dumps(result))
print("INFO hidden line")
print("a table line")
"""


def _run(
    tmp_path: Path,
    world: str,
    stage: str,
    gpus: int,
    *,
    fail: str = "",
    visible: str | None = None,
    ag_gemm_args: str = "",
) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: x)'\n" for i in range(gpus))
    )
    python = bin_dir / "fake-python"
    python.write_text(FAKE_PYTHON)
    for tool in (smi, python):
        tool.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(python),
        "REAL_PYTHON": sys.executable,
        "CALLS": str(tmp_path / "calls.jsonl"),
        "FAIL": fail,
        "REDIS_SERVER": "/opt/redis-server",
        "AG_GEMM_ARGS": ag_gemm_args,
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.run(
        ["bash", str(SCRIPT), world, stage, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _records(tmp_path: Path) -> list[list[str]]:
    """Each bench call: the GPUs it was shown (CUDA_VISIBLE_DEVICES), then its arguments."""
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _calls(tmp_path: Path) -> list[list[str]]:
    return [record[1:] for record in _records(tmp_path)]


def _bench(call: list[str]) -> str:
    return Path(call[4] if call[0] == "-m" else call[0]).name


def test_a_host_with_fewer_gpus_than_the_world_is_refused_before_any_bench(tmp_path):
    done = _run(tmp_path, "8", "rest", gpus=4)
    assert done.returncode == 2 and "needs 8 GPUs of one host; nvidia-smi lists 4" in done.stderr
    assert _calls(tmp_path) == []


def test_the_gpus_the_benches_would_see_are_counted_not_the_hosts(tmp_path):
    done = _run(tmp_path, "4", "ag_gemm", gpus=8, visible="0,1")
    assert done.returncode == 2 and "CUDA_VISIBLE_DEVICES names 2" in done.stderr
    done = _run(tmp_path, "4", "ag_gemm", gpus=8, visible="")  # set and empty: none
    assert done.returncode == 2 and "CUDA_VISIBLE_DEVICES names 0" in done.stderr
    assert _run(tmp_path, "4", "ag_gemm", gpus=8, visible="4,5,6,7,1").returncode == 0
    assert _records(tmp_path)[-1][0] == "4,5,6,7"  # the first N of those named


def test_on_a_larger_host_every_bench_sees_the_first_n_gpus(tmp_path):
    assert _run(tmp_path, "4", "rest", gpus=8).returncode == 0
    assert {record[0] for record in _records(tmp_path)} == {"0,1,2,3"}


@pytest.mark.parametrize(
    ("world", "stage"),
    [
        ("2", "everything"),
        ("2", ""),
        ("2", "rest,"),
        ("3", "rest"),
        ("0", "rest"),
        ("x", "rest"),
        ("08", "rest"),
        ("010", "rest"),
    ],
)
def test_an_odd_or_missing_world_or_an_unknown_stage_is_a_usage_error(tmp_path, world, stage):
    done = _run(tmp_path, world, stage, gpus=8)
    assert done.returncode == 2 and "usage:" in done.stderr
    assert _calls(tmp_path) == []


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_ag_gemm_stage_times_the_example_manifests_shapes_at_n_ranks(tmp_path, world):
    done = _run(tmp_path, str(world), "ag_gemm", gpus=8, ag_gemm_args="--iters 45")
    assert done.returncode == 0, done.stderr
    (call,) = _calls(tmp_path)
    assert call[:4] == ["-m", "torch.distributed.run", "--nproc-per-node", str(world)]
    assert call[4].endswith("bench/ag_gemm.py")
    assert call[5:] == [
        "--manifest",
        str(ROOT / "examples" / "llama-70b-tp8.yaml"),
        "--iters",
        "45",
        "--out",
        str(tmp_path / "out" / f"ag_gemm_{world}gpu.json"),
    ]


def test_the_rows_stage_spans_96_to_16384_rows_each_split_evenly_over_eight(tmp_path):
    done = _run(tmp_path, "8", "ag_gemm_rows", gpus=8)
    assert done.returncode == 0, done.stderr
    (call,) = _calls(tmp_path)
    shapes = [call[i + 1] for i, arg in enumerate(call) if arg == "--shape"]
    rows = [int(shape.split(",")[0]) for shape in shapes]
    assert rows[0] == 96 and rows[-1] == 16384 and rows == sorted(rows) and len(rows) >= 8
    assert all(m % 8 == 0 for m in rows)
    assert {shape.split(",", 1)[1] for shape in shapes} == {"7168,8192"}
    assert call[-1] == str(tmp_path / "out" / "ag_gemm_rows_8gpu.json")


def test_the_rest_stage_runs_cold_start_serving_and_a_fleet_of_two_half_pods(tmp_path):
    done = _run(tmp_path, "8", "rest", gpus=8)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    calls = _calls(tmp_path)
    assert [_bench(c) for c in calls] == ["cold_start.py", "serving.py", "fleet.py"]
    assert calls[0][1:] == ["--world", "8", "--out", str(out / "cold_start_8gpu.json")]
    assert calls[1][1:] == ["--nproc", "8", "--out", str(out / "serving_8gpu.json")]
    assert calls[2][1:] == [
        "--pods", "2", "--ranks", "4", "--redis-server", "/opt/redis-server",
        "--out", str(out / "fleet_2x4.json"),
    ]  # fmt: skip
    assert "INFO hidden line" not in done.stdout and "a table line" in done.stdout
    assert "INFO hidden line" in (out / "fleet_2x4.log").read_text()  # kept whole in the log
    assert done.stdout.count("| volume: 2 pods x 1 rank(s), slowest pod") == 3  # per file


def test_the_pod_ready_stage_runs_the_tensor_parallel_model_at_n_ranks(tmp_path):
    done = _run(tmp_path, "4", "pod_ready", gpus=4)
    assert done.returncode == 0, done.stderr
    (call,) = _calls(tmp_path)
    assert _bench(call) == "pod_ready.py" and call[1:3] == ["--world", "4"]
    cases = call[call.index("--cases") + 1].split(",")
    assert {"cold", "persisted", "first_pod", "warm_fleet"} <= set(cases)
    assert call[call.index("--models") + 1] == "ag_mlp"


def _outs(tmp_path: Path) -> list[str]:
    return [Path(call[-1]).stem for call in _calls(tmp_path)]


def test_all_runs_every_stage_in_order_and_a_list_runs_those_named_once(tmp_path):
    assert _run(tmp_path, "2", "all", gpus=2).returncode == 0
    every = ["ag_gemm_2gpu", "ag_gemm_rows_2gpu", "cold_start_2gpu", "serving_2gpu"]
    assert _outs(tmp_path) == [*every, "fleet_2x1", "pod_ready_2gpu"]
    (tmp_path / "calls.jsonl").unlink()
    assert _run(tmp_path, "2", "pod_ready,ag_gemm,pod_ready", gpus=2).returncode == 0
    assert _outs(tmp_path) == ["pod_ready_2gpu", "ag_gemm_2gpu"]
    (tmp_path / "calls.jsonl").unlink()
    assert _run(tmp_path, "2", "rest,all", gpus=2).returncode == 0
    assert _outs(tmp_path)[:3] == ["cold_start_2gpu", "serving_2gpu", "fleet_2x1"]
    assert len(_outs(tmp_path)) == 6


def test_a_failed_bench_does_not_stop_the_others_and_fails_the_run(tmp_path):
    done = _run(tmp_path, "4", "rest", gpus=4, fail="serving_4gpu")
    assert done.returncode == 1
    assert "== serving_4gpu: FAILED (exit 3)" in done.stderr
    assert len(_calls(tmp_path)) == 3  # the fleet still ran
    assert str(tmp_path / "out" / "fleet_2x2.json") in done.stdout  # and was judged
    assert "serving_4gpu.json" not in done.stdout
