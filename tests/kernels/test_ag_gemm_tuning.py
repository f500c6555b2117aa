"""What the tuner needs of the AllGather-GEMM: its task tuned in lockstep (one process
per rank over gloo, the Triton interpreter), its reference and key, its kernel hash."""

import pytest

from tests.kernels._ag_gemm_ranks import run_ranks


@pytest.mark.slow
def test_agrees_with_the_gather_then_matmul_reference(tmp_path):
    for result in run_ranks(2, "reference", tmp_path):
        assert result["max_diff"] < 1e-4
        assert result["key"] == {"M": 16, "N": 20, "K": 24, "dtype": "fp32", "world": 2}
        assert result["fused"] is None  # torch's fused op is CUDA-only


@pytest.mark.slow
def test_the_task_tunes_in_lockstep_through_the_tuner(tmp_path):
    results = run_ranks(2, "tuned", tmp_path)
    assert results[0]["winner"] == results[1]["winner"]
    assert {r["source"] for r in results} == {"tuned"}
    assert all(r["errors"] == [] for r in results)  # every candidate passed its check
    assert results[0]["stored"] == 1


@pytest.mark.slow
def test_a_task_remakes_the_inputs_and_reference_it_dropped_on_every_rank(tmp_path):
    for result in run_ranks(2, "dropped_inputs", tmp_path):
        assert result == {
            "rank": result["rank"],
            "dropped": True,
            "key_kept": True,
            "same": True,
            "same_reference": True,
            "check": None,
        }


@pytest.mark.slow
@pytest.mark.parametrize("winner", ["nccl_cublas", "overlap_cublas", "fused_pull"])
def test_the_tuner_stores_the_algorithm_the_clock_finds_fastest(winner, tmp_path):
    """The baseline is a candidate like any other: where it wins, it is what is stored."""
    results = run_ranks(2, f"fake_clock:{winner}", tmp_path)
    assert [r["winner"].get("algorithm") for r in results] == [winner, winner]
    assert [c.get("algorithm") for c in results[0]["stored"]] == [winner]
    assert results[0]["measured"] == sorted(
        ["nccl_cublas", "gather_cublas", "overlap_cublas", "fused_pull"]
    )
    default = results[0]["default_candidates"]
    assert default[:3] == ["nccl_cublas", "gather_cublas", "overlap_cublas"]  # baseline first
    assert set(default[3:]) == {"fused_pull"} and len(default) > 4


def test_the_kernel_hash_changes_with_the_algorithms(monkeypatch):
    """A version that adds an algorithm must tune again: its fingerprint differs."""
    from kernels import ag_gemm_tuning

    before = ag_gemm_tuning.kernel_hash()
    monkeypatch.setattr(ag_gemm_tuning, "ALGORITHMS", (*ag_gemm_tuning.ALGORITHMS, "one_more"))
    assert ag_gemm_tuning.kernel_hash() != before
