"""The 4-GPU driver: refuses a host with fewer GPUs, runs each stage's benches with their
flags and --out, keeps going past a failed bench, and judges what the others wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "four_gpus.sh"

# A fake python: a bench call is recorded and writes a fleet result to its --out (or fails
# when its name is in FAIL); bench/targets.py runs for real.
FAKE_PYTHON = """#!/usr/bin/env python3
import json, os, subprocess, sys
args = sys.argv[1:]
if args and args[0].endswith("targets.py"):
    sys.exit(subprocess.run([os.environ["REAL_PYTHON"], *args]).returncode)
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps(args) + "\\n")
out = args[args.index("--out") + 1]
if any(name in out for name in os.environ.get("FAIL", "").split(",") if name):
    print("boom", file=sys.stderr)
    sys.exit(3)
mode = {"all_ready": True, "tuned_in_fleet": 2, "tuned_once": True, "slowest_s": 3.0,
        "slowest_over_solo": 0.3, "target": 0.35, "target_met": True}
result = {"pods": 4, "ranks": 1, "device": "cuda", "gpus": ["0", "1", "2", "3"],
          "shapes": [[1, 1, 1]] * 2, "shared_gpus": False, "modes": {"volume": mode}}
open(out, "w").write(json.dumps(result))
print("INFO hidden line")
print("a table line")
"""


def _run(
    tmp_path: Path, stage: str, gpus: int, fail: str = "", visible: str = ""
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
        "CUDA_VISIBLE_DEVICES": visible,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), stage, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _calls(tmp_path: Path) -> list[list[str]]:
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_host_with_fewer_than_four_gpus_is_refused_before_any_bench(tmp_path):
    done = _run(tmp_path, "rest", gpus=2)
    assert done.returncode == 2 and "needs 4 GPUs of one host; nvidia-smi lists 2" in done.stderr
    assert not (tmp_path / "calls.jsonl").exists()


def test_the_gpus_the_benches_would_see_are_counted_not_the_hosts(tmp_path):
    done = _run(tmp_path, "ag_gemm", gpus=8, visible="0,1")
    assert done.returncode == 2 and "CUDA_VISIBLE_DEVICES names 2" in done.stderr
    assert _run(tmp_path, "ag_gemm", gpus=8, visible="4,5,6,7").returncode == 0


@pytest.mark.parametrize("stage", ["all", ""])
def test_an_unknown_stage_is_a_usage_error(tmp_path, stage):
    done = _run(tmp_path, stage, gpus=4)
    assert done.returncode == 2 and "usage:" in done.stderr


def test_the_rest_stage_runs_serving_and_both_fleets_then_judges_them(tmp_path):
    done = _run(tmp_path, "rest", gpus=4)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    calls = _calls(tmp_path)
    assert [Path(c[0]).name for c in calls] == ["serving.py", "fleet.py", "fleet.py"]
    assert calls[0][1:] == ["--nproc", "4", "--out", str(out / "serving_4gpu.json")]
    assert calls[1][1:5] == ["--pods", "4", "--ranks", "1"]
    assert calls[2][1:5] == ["--pods", "2", "--ranks", "2"]
    assert all(c[5:7] == ["--redis-server", "/opt/redis-server"] for c in calls[1:])
    assert "INFO hidden line" not in done.stdout and "a table line" in done.stdout
    assert "INFO hidden line" in (out / "fleet_4x1.log").read_text()  # kept whole in the log
    assert done.stdout.count("| volume: 4 pods x 1 rank(s), slowest pod") == 3  # per file


def test_a_failed_bench_does_not_stop_the_others_and_fails_the_stage(tmp_path):
    done = _run(tmp_path, "rest", gpus=4, fail="fleet_4x1")
    assert done.returncode == 1
    assert "== fleet_4x1: FAILED (exit 3)" in done.stderr
    assert len(_calls(tmp_path)) == 3  # the 2x2 fleet still ran
    assert str(tmp_path / "out" / "fleet_2x2.json") in done.stdout  # and was judged
    assert "fleet_4x1.json" not in done.stdout


def test_the_ag_gemm_stage_runs_four_ranks_under_torchrun(tmp_path):
    done = _run(tmp_path, "ag_gemm", gpus=8)
    assert done.returncode == 0, done.stderr
    (call,) = _calls(tmp_path)
    assert call[:4] == ["-m", "torch.distributed.run", "--nproc-per-node", "4"]
    assert call[4].endswith("bench/ag_gemm.py") and call[5] == "--out"
