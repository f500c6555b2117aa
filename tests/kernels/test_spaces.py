import pytest

from kernels.spaces import (
    CPU_LIMITS,
    PREDICATES,
    DeviceLimits,
    EmptySpace,
    Problem,
    ag_gemm_space,
    ordered,
    predicted_us,
    prune,
)
from registry import KernelConfig

H200 = DeviceLimits("NVIDIA H200", 132, 232448, (9, 0), 790.0, 4300.0)
A100 = DeviceLimits("NVIDIA A100", 108, 166912, (8, 0), 300.0, 1500.0)


def config(bm, bn, bk, *, warps=4, stages=3):
    return KernelConfig.make(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
        num_warps=warps,
        num_stages=stages,
    )


def test_space_depends_on_the_device():
    hopper, ampere, cpu = ag_gemm_space(H200), ag_gemm_space(A100), ag_gemm_space(CPU_LIMITS)
    assert len(set(hopper)) == len(hopper) and len(hopper) > len(cpu)
    assert max(c.meta["BLOCK_M"] for c in hopper) == 256
    assert max(c.num_stages for c in ampere) < max(c.num_stages for c in hopper)
    assert all(c.meta["BLOCK_M"] <= 32 for c in cpu)


def test_hopper_gets_the_tma_consumers_epilogue_knob_for_wide_tiles():
    hopper, ampere = ag_gemm_space(H200), ag_gemm_space(A100)
    subtiled = [c for c in hopper if c.meta.get("EPILOGUE_SUBTILE") == 2]
    assert subtiled and all(c.meta["BLOCK_N"] == 256 for c in subtiled)
    assert len(subtiled) == sum(1 for c in hopper if c.meta["BLOCK_N"] == 256) // 2
    assert not any("EPILOGUE_SUBTILE" in c.meta for c in ampere)


def test_a_subtiled_epilogue_needs_half_the_epilogue_memory():
    fits, _ = PREDICATES["shared_memory"]
    problem = Problem(8192, 8192, 8192, 2)
    whole = config(128, 256, 64, stages=4)  # 4 * (128*64 + 64*256) * 2 + 128*256*2 > 227 KiB
    halves = KernelConfig.make({**whole.meta, "EPILOGUE_SUBTILE": 2}, num_warps=8, num_stages=4)
    assert not fits(whole, problem, H200) and fits(halves, problem, H200)


def test_shared_memory_predicate_uses_the_device_limit():
    fits, _ = PREDICATES["shared_memory"]
    big = config(256, 256, 64, stages=4)  # 4 * (256*64 + 64*256) * 2 + 256*256*2 bytes
    problem = Problem(8192, 8192, 8192, 2)
    assert not fits(big, problem, H200)
    assert fits(config(128, 128, 64, stages=3), problem, H200)
    assert not fits(config(128, 256, 64, stages=4), problem, A100)


def test_warps_predicate_needs_a_16x16_piece_per_warp():
    per_warp, _ = PREDICATES["warps_per_tile"]
    problem = Problem(64, 64, 64, 1)
    assert per_warp(config(32, 32, 32, warps=4), problem, H200)
    assert not per_warp(config(16, 32, 32, warps=4), problem, H200)


def test_prune_reports_every_predicate_and_waives_soft_ones():
    space = ag_gemm_space(H200)
    report = prune(space, Problem(4096, 6656, 16384, 2), H200)
    assert set(report.rejected) == set(PREDICATES)
    assert report.rejected["shared_memory"] > 0
    assert len(report.kept) + sum(report.rejected.values()) == len(space)
    odd = prune(space, Problem(3 * 13, 23, 19, 3), H200)  # no tile divides 13 rows
    assert "rank_block_divisible" in odd.waived and odd.kept
    assert "waived" in odd.describe()


def test_tile_not_far_larger_than_the_problem():
    report = prune(ag_gemm_space(H200), Problem(2 * 64, 64, 64, 2), H200)
    assert all(c.meta["BLOCK_N"] <= 128 and c.meta["BLOCK_K"] <= 128 for c in report.kept)


def test_empty_space_is_a_named_error():
    with pytest.raises(EmptySpace, match="shared_memory rejected 1"):
        prune([config(256, 256, 128, stages=5)], Problem(4096, 4096, 4096, 2), H200)


def test_model_orders_big_problems_toward_big_tiles():
    problem = Problem(4096, 6656, 16384, 2)
    kept = prune(ag_gemm_space(H200), problem, H200).kept
    best = ordered(kept, problem, H200)[0]
    assert best.meta["BLOCK_M"] * best.meta["BLOCK_N"] >= 128 * 128
    assert predicted_us(best, problem, H200) < predicted_us(config(64, 64, 64), problem, H200)
    spilling = config(128, 256, 64, warps=4)
    assert predicted_us(spilling, problem, H200) > predicted_us(
        config(128, 256, 64, warps=8), problem, H200
    )
