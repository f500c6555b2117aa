"""CUDA graphs of the AllGather-GEMM on 2 GPUs: captured once, replayed with fresh data.

Skipped without 2 GPUs (CI has none); run on a GPU machine with ``pytest tests/gpu``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def test_every_algorithm_and_the_serving_op_replay_from_a_graph_with_fresh_data(tmp_path):
    out = tmp_path / "graphs.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, "-m", "tests.gpu._graph_ranks", str(out)],
        cwd=ROOT,
        env={**os.environ, **MULTICAST_OFF, "TRITON_INTERPRET": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())
    assert {row["case"] for row in rows} >= {"fused tma", "serving op"}
    for row in rows:
        assert row["replays"] == 100
        assert row["max_rel_error"] < 2e-2, row  # bf16 inputs, float32 reference
        assert row["eager_max_rel_error"] < 2e-2, row
    served = next(row for row in rows if row["case"] == "serving op")
    assert "fused_pull" in served["config"]
