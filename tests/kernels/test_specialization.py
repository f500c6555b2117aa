"""No M compiles: every batch size of a served layer runs one JIT variant per config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import ag_gemm
from registry import KernelConfig
from tests.conftest import env_without_interpreter
from tests.kernels._specialization_keys import CONFIG, K, N, context

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_m_up_to_max_is_one_variant_and_the_serving_warm_up_builds_it():
    # Runs Triton's own binder for an sm90 target (no GPU, no interpreter) over every M.
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests/kernels/_specialization_keys.py"), "300"],
        env=env_without_interpreter(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report) == 7
    for name, found in report.items():
        assert found == {"variants": 1, "warm_up_hits": True}, name


@pytest.mark.parametrize("consumer", ["tma", "portable"])
def test_a_launch_passes_every_launch_option_of_its_config(consumer):
    config = KernelConfig.make(CONFIG.meta, num_warps=4, num_stages=3, num_ctas=1, maxnreg=128)
    ctx = context(2, consumer, 32)
    g, b = ctx.buffer[:32], torch.empty(K, N, dtype=torch.bfloat16)
    out = torch.empty(32, N, dtype=torch.bfloat16)
    options = ag_gemm.launch_plan(ctx, g, b, out, 16, config).options
    assert options["num_ctas"] == 1 and options["maxnreg"] == 128 and options["WORLD"] == 2
