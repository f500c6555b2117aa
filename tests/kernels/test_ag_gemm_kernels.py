"""The AllGather-GEMM's Triton code: the Hopper consumer compiled for sm90 without a GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import env_without_interpreter

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_hopper_consumer_compiles_for_sm90_with_its_synchronisation(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels._compile_tma_sm90"],
        cwd=ROOT,
        env=env_without_interpreter(TRITON_CACHE_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(done.stdout.strip().splitlines()[-1])
    for ptx in variants.values():
        assert ptx["acquire_loads"] >= 1 and ptx["async_proxy_fence"], ptx
        assert ptx["wgmma"] and ptx["tma_loads"]
        assert ptx["shared"] <= 232448  # the H200's per-block limit
    assert (variants["whole"]["tma_stores"], variants["halves"]["tma_stores"]) == (1, 2)
