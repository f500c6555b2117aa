"""The AllGather-GEMM as warmup/ drives it: its adapter, its served layer, and the names
callers import from ``kernels.ag_gemm`` whatever layer defines them."""

import pytest
import torch

import kernels
from kernels import ag_gemm, ag_gemm_launch, ag_gemm_tuning, ag_gemm_workspace
from kernels.adapter import Layer
from kernels.shapes import RULES

# What the benches, the GPU tests and the serving ranks take from kernels.ag_gemm
USED = {
    ag_gemm_launch: ["ALGORITHMS", "ALL_GATHER", "BASELINE", "BASELINE_CONFIG", "FUSED",
                     "ag_gemm", "algorithm_of", "launch_plan"],
    ag_gemm_tuning: ["AgGemmTask", "candidates", "kernel_hash", "key", "library_configs",
                     "problem", "reference", "space", "torch_fused"],
    ag_gemm_workspace: ["AgGemmContext", "create_context", "input_buffer"],
}  # fmt: skip


@pytest.mark.parametrize("layer", list(USED))
def test_every_layers_names_that_callers_use_are_importable_from_here(layer):
    for name in USED[layer]:
        assert getattr(ag_gemm, name) is getattr(layer, name), name
        assert name in ag_gemm.__all__, name


def test_the_adapter_is_the_tables_and_its_shape_check_is_the_rule_read_without_torch():
    assert kernels.adapter_for("ag_gemm") is ag_gemm.ADAPTER
    assert ag_gemm.ADAPTER.check_shape({"M": 63, "N": 8, "K": 8}, world_size=2) == (
        "M=63 is not a multiple of world_size 2"
    )
    for m, world in [(64, 2), (63, 1), (9, 3)]:
        shape = {"M": m, "N": 8, "K": 8}
        assert ag_gemm.ADAPTER.check_shape(shape, world_size=world) is None
        assert RULES["ag_gemm"].check(shape, world_size=world) is None


def test_a_served_layer_keys_as_the_adapter_and_names_a_b_of_another_layer():
    served = ag_gemm.ADAPTER.serve(Layer(8, 16, "fp32", 4), group=None, device="cpu")
    assert served.key(4) == ag_gemm.ADAPTER.key(m=4, n=8, k=16, dtype="fp32", world=1)
    assert served.key(4) == {"M": 4, "N": 8, "K": 16, "dtype": "fp32", "world": 1}
    shard, b = torch.randn(4, 16), torch.randn(16, 8)
    assert served.rows(shard, b) == 4 and not served.collective
    out = served(served.default_config(), shard, b)
    assert torch.allclose(out, shard @ b)
    with pytest.raises(ValueError, match=r"b is \[16, 6\]; this layer's is \[16, 8\]"):
        served(served.default_config(), shard, torch.randn(16, 6))
