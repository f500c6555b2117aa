"""``make demo`` end to end in a scratch folder: first run tunes, second run only hits."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


def _demo(cwd: Path) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(cwd)}
    done = subprocess.run(
        [sys.executable, "-m", "warmup.demo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_demo_tunes_then_hits(tmp_path):
    first = _demo(tmp_path)
    assert first.count("MISS -> tuned 4 configs") == 3
    assert "Triton cache HIT" in first and "3/3 shapes hit in pod B" in first
    assert "3 entries in demo-volume/registry" in first
    second = _demo(tmp_path)
    assert "MISS" not in second.split("[2]")[0] and second.count(": HIT") == 3
    assert "0 new artifacts" in second
