"""No M compiles: every batch size of a served layer runs one JIT variant per config."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import ag_gemm_launch
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
    options = ag_gemm_launch.launch_plan(ctx, g, b, out, 16, config).options
    assert options["num_ctas"] == 1 and options["maxnreg"] == 128 and options["WORLD"] == 2


@pytest.mark.parametrize("consumer", ["tma", "portable"])
@pytest.mark.parametrize("world", [1, 2])
def test_a_fused_launch_prepared_at_one_m_runs_every_m_as_its_own_plan_would(
    consumer, world, monkeypatch
):
    # A served op's first call at a new M makes no launch plan: the grid and arguments of
    # the launch prepared at another M, with this M put in, must be that M's plan's.
    monkeypatch.setattr(ag_gemm_launch, "_compiled", lambda ctx, plan: "compiled")
    ctx = context(world, consumer, 8192)
    b = torch.empty(K, N, dtype=torch.bfloat16)

    def operands(m):
        g = ctx.buffer[:m] if world > 1 else torch.empty(m, K, dtype=torch.bfloat16)
        return g, torch.empty(m, N, dtype=torch.bfloat16)

    g, out = operands(64 * world)
    prepared = ag_gemm_launch._Prepared.of(
        ctx, ag_gemm_launch.launch_plan(ctx, g, b, out, 64, CONFIG), g
    )
    assert prepared.persistent is (consumer == "tma") and prepared.owns_g is (world > 1)
    for m_per_rank in (1, 7, 64, 65, 1000, 8192 // world):  # the last: more tiles than SMs
        g, out = operands(m_per_rank * world)
        plan = ag_gemm_launch.launch_plan(ctx, g, b, out, m_per_rank, CONFIG)
        at = prepared.at_rows(ctx, g, N, m_per_rank, CONFIG)
        assert at.grid == (*plan.grid, 1, 1)[:3], m_per_rank
        assert at.tail == plan.full_args()[3:], m_per_rank
        if world > 1:  # the workspace's rows: their operand is kept with them
            assert at.g is g and type(at.g_operand) is type(plan.args[0])
        else:  # the caller's shard: nothing of it is kept
            assert at.g is None and at.g_operand is None
    assert (prepared.tail[prepared.m_at[0]], prepared.tail[prepared.m_at[1]]) == (64 * world, 64)


class _Recorder:
    """A compiled kernel that records each launch's grid and arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


@pytest.mark.parametrize("consumer", ["tma", "portable"])
def test_the_fused_launch_keeps_one_preparation_and_each_m_its_own_grid_and_arguments(
    consumer, monkeypatch
):
    # On "CUDA" (faked): every call launches what its own plan would, the first at an M
    # included; one preparation serves every M; a new view of the rows is described anew.
    recorder = _Recorder()
    plans = []
    monkeypatch.setattr(
        ag_gemm_launch, "_compiled", lambda ctx, plan: plans.append(plan) or recorder
    )
    ctx = dataclasses.replace(context(2, consumer, 512), device=torch.device("cuda"))
    b = torch.empty(K, N, dtype=torch.bfloat16)
    calls = [(64, ctx.buffer[:128]), (100, ctx.buffer[:200]), (64, ctx.buffer[:128])]
    views = [g for _, g in calls]
    views[2] = views[0]  # the same view again: its operand is kept
    for (m_per_rank, _), g in zip(calls, views, strict=True):
        out = torch.empty(g.shape[0], N, dtype=torch.bfloat16)
        ag_gemm_launch._launch_fused(ctx, g, b, out, m_per_rank, CONFIG)
        plan = ag_gemm_launch.launch_plan(ctx, g, b, out, m_per_rank, CONFIG)
        grid, args = recorder.launches[-1]
        assert grid == (*plan.grid, 1, 1)[:3] and args[3:] == plan.full_args()[3:]
        if consumer == "tma":  # the descriptors: the plan's shapes, strides and blocks
            for made, planned in zip(args[:3], plan.args[:3], strict=True):
                assert (made.shape, made.strides, made.block_shape) == (
                    planned.shape,
                    planned.strides,
                    planned.block_shape,
                )
    assert len(plans) == 1  # prepared once, at the first M
    prepared = next(v for k, v in ctx.cache.items() if k[0] == "fused")
    assert set(prepared.rows) == {(128, 64), (200, 100)}
    kept = prepared.rows[(128, 64)]
    fresh = ctx.buffer[:128]  # a new view of the same rows: not the kept one
    ag_gemm_launch._launch_fused(
        ctx, fresh, b, torch.empty(128, N, dtype=torch.bfloat16), 64, CONFIG
    )
    assert prepared.rows[(128, 64)] is not kept and prepared.rows[(128, 64)].g is fresh
    assert recorder.launches[2][1][0] is kept.g_operand  # the same view: its operand reused
    assert recorder.launches[-1][1][0] is prepared.rows[(128, 64)].g_operand
