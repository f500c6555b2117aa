"""The fleet learns, on CPU (``bench/fleet_learns.py --device cpu``): pod A serves a
compiled model at batch sizes its manifest does not list and compiles them; its
sidecar's harvest keeps what it learned; pod B, started after on the same volume,
serves the same trace and compiles nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import env_without_interpreter

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_what_pod_a_compiled_under_traffic_pod_b_does_not_compile(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it where apt-get works)")
    out = tmp_path / "fleet.json"
    done = subprocess.run(
        [sys.executable, "bench/fleet_learns.py", "--device", "cpu", "--steady-s", "0.2",
         "--pods", "A,B", "--out", str(out)],
        cwd=ROOT,
        env=env_without_interpreter(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["A"]["model_compiles"] > 0  # the trace's sizes are new to pod A
    assert summary["B"] == {"built": 0, "autotune_runs": 0, "model_compiles": 0, "loads": 0}
    harvested = {k: v for k, v in result["harvest"].items() if "'harvested'" in k}
    assert any("inductor" in k and v > 0 for k, v in harvested.items()), result["harvest"]
    # B's init finds everything stored for its host (what A's server compiled included):
    # a full hit, which restores for the server and predicts nothing
    assert result["B_init"]["full_hit"], result["B_init"]["warmed_because"]
    assert result["B_init"]["explain"] == []
    assert not result["A_init"]["full_hit"]
    assert any(
        line.startswith("inductor: EMPTY") or "MISS" in line
        for line in result["A_init"]["explain"]
        if line.startswith("inductor")
    )
