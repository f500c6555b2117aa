"""The AllGather-GEMM's memory: one workspace per process and group, shared by its layers."""

from __future__ import annotations

import pytest

from tests.kernels._ag_gemm_ranks import run_ranks


@pytest.mark.slow
def test_layers_of_one_process_share_one_workspace_and_stay_correct(tmp_path):
    for result in run_ranks(2, "shared", tmp_path):
        # the reservation mapped it once; both layers it holds made no rendezvous
        assert result["before_growth"] == {
            "workspace.map": 1,
            "workspace.rendezvous": 1,
            "workspace.made": 1,
            "workspace.reused": 2,
        }, result
        assert result["one_space"] and result["same_rows"], result
        # a layer too large for it grows it: one more, for the layers made after
        assert result["grown"] and result["counts"]["workspace.made"] == 2, result
        assert max(result["errors"]) < 1e-5, result  # calls interleaved over the layers
