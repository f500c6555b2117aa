"""``make demo`` end to end in a scratch folder: tune, then all hits, then ready."""

import time

import pytest

from tests.conftest import ROOT, run_python

pytestmark = pytest.mark.slow


def test_demo_tunes_then_hits_then_is_ready(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path),
        "TRITON_WARMUP_MANIFEST": str(ROOT / "examples" / "demo.yaml"),
    }
    started = time.time()
    done = run_python("-m", "warmup.demo", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    first, second = out.split("== second run")
    assert "warmup ready: 6 shape-rank results (6 tuned)" in first
    assert "model demo-mlp: warm (2 shapes, 2 graphs compiled, 0 cache hits)" in first
    # a new pod on a warm volume: a full hit, restored for the server, no rank started
    assert "warmup ready: 3 shape-rank results (3 registry), 0 benchmark runs" in second
    assert "a full hit: caches restored for the server, no rank started" in second
    assert "model demo-mlp: restored for the server in" in second
    assert 'triton_warmup_model_ready{model="demo-mlp"} 1.0' in out
    assert "GET /readyz -> 200" in out
    assert 'triton_warmup_cache_hits_total{kernel="ag_gemm",source="registry"} 3.0' in out
    assert (tmp_path / "demo-volume" / "registry" / "current").is_symlink()
    assert time.time() - started < 180
