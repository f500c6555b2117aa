"""The AllGather-GEMM's launcher on CPU: one process per rank over gloo, the Triton
interpreter; its algorithms, the protocol they follow, its checks, the fused call's order."""

import pytest

from tests.kernels._ag_gemm_ranks import run_ranks


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])  # 4: the ranks of [2.7]'s GPU runs
def test_matches_float64_reference_at_odd_shapes(world, tmp_path):
    for result in run_ranks(world, "correctness", tmp_path):
        assert len(result["results"]) == 6
        for row in result["results"]:
            assert row["written"], f"rank {result['rank']} left unwritten outputs: {row}"
            assert row["rel_error"] < 1e-5, row
        assert [r["calls"] for r in result["results"]] == [1, 2] * 3
        assert result["default_group_named"]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_algorithm_matches_the_reference_calls_after_calls(world, tmp_path):
    expected = {"nccl_cublas", "fused_pull"} | (
        {"gather_cublas", "overlap_cublas"} if world > 1 else set()
    )
    for result in run_ranks(world, "algorithms", tmp_path):
        assert {row["algorithm"] for row in result["results"]} == expected
        for row in result["results"]:
            assert row["written"], f"rank {result['rank']} left unwritten outputs: {row}"
            assert row["rel_error"] < 1e-5, row


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_protocol_holds_when_ranks_drift_apart_at_every_step(world, tmp_path):
    """Random pauses before every step on every rank, every algorithm, a new M each call:
    the barrier and the flags alone keep each call's rows apart from the next's."""
    for result in run_ranks(world, "protocol", tmp_path, timeout=120):  # a deadlock fails
        assert len(result["results"]) == 12
        for row in result["results"]:
            assert row["rel_error"] < 1e-5, (result["rank"], row)


@pytest.mark.slow
def test_a_flag_raised_before_its_rows_is_caught(tmp_path):
    """The check above can fail: a push that raises its flag before the rows land makes
    the peers read stale rows."""
    results = run_ranks(2, "protocol:signal_before_data", tmp_path, timeout=120)
    worst = max(row["rel_error"] for result in results for row in result["results"])
    assert worst > 1e-2


@pytest.mark.slow
def test_a_launch_failing_past_the_barrier_raises_and_leaves_the_context_working(tmp_path):
    for result in run_ranks(2, "failed_launch", tmp_path, timeout=120):
        assert result["error"] is not None
        assert max(result["errors"]) < 1e-5, result


@pytest.mark.slow
def test_bad_inputs_raise_value_errors_and_launch_nothing(tmp_path):
    for result in run_ranks(2, "bad_inputs", tmp_path):
        messages = result["messages"]
        assert all(messages.values()), messages
        assert "context was made for torch.float32" in messages["dtype"]
        assert "contiguous" in messages["non_contiguous"]
        assert "must be [K=16, N]" in messages["k_mismatch"]
        assert "exceeds the context's [16, 16]" in messages["above_max"]
        assert "multiple of the world size 2" in messages["max_m_not_divisible"]
        assert result["calls_after"] == 0


@pytest.mark.slow
def test_a_shard_written_in_place_skips_the_copy_and_stays_correct(tmp_path):
    for result in run_ranks(3, "in_place", tmp_path):
        assert max(result["errors"]) < 1e-5, result


def test_a_config_naming_an_algorithm_this_version_lacks_is_refused_by_name():
    import torch

    from kernels import ag_gemm_launch
    from kernels.ag_gemm_workspace import create_context
    from registry import KernelConfig

    ctx = create_context(None, max_m=4, k=8, dtype=torch.float32, device="cpu")
    shard, b = torch.randn(4, 8), torch.randn(8, 4)
    with pytest.raises(ValueError, match="names algorithm 'warp_magic'; this version runs"):
        ag_gemm_launch.ag_gemm(shard, b, ctx, KernelConfig.make(algorithm="warp_magic"))
    assert ctx.calls == 0  # refused before the call counted
    out = ag_gemm_launch.ag_gemm(
        shard, b, ctx, KernelConfig.make(algorithm=ag_gemm_launch.BASELINE)
    )
    assert torch.allclose(out, shard @ b)


@pytest.fixture
def fused_call(monkeypatch):
    """``_run_fused`` on a context that says CUDA, its steps recorded in order (no GPU):
    the workspace's steps and the consumer's launch stubbed."""
    import torch

    from kernels import ag_gemm_launch
    from kernels import ag_gemm_workspace as workspace
    from kernels.ag_gemm_workspace import AgGemmContext, Rows
    from kernels.spaces import device_limits

    steps = []
    g, b, out = torch.zeros(4, 8), torch.zeros(8, 4), torch.zeros(4, 4)
    ctx = AgGemmContext(
        group=None, rank=0, world=2, max_m=4, k=8, dtype=torch.float32,
        device=torch.device("cuda", 0), limits=device_limits(torch.device("cpu")),
        buffer=g, flags=torch.zeros(2, dtype=torch.int32), one=torch.ones(1, dtype=torch.int32),
    )  # fmt: skip
    rows = Rows(g, g[:2], ())
    monkeypatch.setattr(workspace, "arm_and_meet", lambda ctx, a: steps.append("arm") or rows)
    monkeypatch.setattr(workspace, "push_aside", lambda ctx, a, at: steps.append("push"))
    monkeypatch.setattr(workspace, "join", lambda ctx: steps.append("join"))
    monkeypatch.setattr(ag_gemm_launch, "_await_rows", lambda *args: steps.append("await"))

    def launch(*args, key=None):
        steps.append("launch")
        if ctx.cache.get("fail"):
            raise RuntimeError("launch failed")

    monkeypatch.setattr(ag_gemm_launch, "_launch_fused", launch)
    config = ag_gemm_launch.BASELINE_CONFIG

    def call(*, warm: bool, fail: bool = False) -> list[str]:
        steps.clear()
        ctx.cache.clear()
        if warm:
            ctx.cache[ag_gemm_launch._fused_key(ctx, config, g, b, out)] = object()
        ctx.cache["fail"] = fail
        try:
            ag_gemm_launch._run_fused(ctx, g[:2], b, out, config)
        except RuntimeError:
            steps.append("raised")
        return list(steps)

    return call


def test_a_warm_fused_call_launches_its_consumer_before_its_pushes(fused_call):
    assert fused_call(warm=True) == ["arm", "launch", "push", "join"]


def test_a_first_fused_call_or_a_blocking_launch_pushes_first(fused_call, monkeypatch):
    from kernels import ag_gemm_launch

    assert fused_call(warm=False) == ["arm", "push", "launch", "join"]  # it may compile
    monkeypatch.setattr(ag_gemm_launch, "LAUNCH_BLOCKING", True)
    assert fused_call(warm=True) == ["arm", "push", "launch", "join"]


def test_a_failed_consumer_launch_still_pushes_this_ranks_rows_then_settles(fused_call):
    # the peers are past the barrier and wait for this rank's rows: pushed, then every
    # peer's rows awaited and the side stream joined, before the error goes up
    assert fused_call(warm=True, fail=True) == ["arm", "launch", "push", "await", "join", "raised"]
    assert fused_call(warm=False, fail=True) == ["arm", "push", "launch", "await", "join", "raised"]
