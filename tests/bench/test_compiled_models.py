"""bench/compiled_models.py on the CPU: the models take their weights from a file (the
same weights as before [5.2]), the AllGather-GEMM MLP is a module that exports, and its
NCCL + cuBLAS variant computes the same MLP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench import compiled_models
from bench.model_weights import ENV


@pytest.fixture(autouse=True)
def weights_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "weights"))
    return tmp_path / "weights"


def test_small_mlp_loads_the_weights_it_was_initialised_with_before(weights_dir):
    torch.manual_seed(0)
    before = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
    model = compiled_models.small_mlp_eager("cpu")
    assert not any(p.is_meta for p in model.parameters()) and not model.training
    x = torch.randn(4, 64)
    assert torch.equal(model(x), before(x))
    assert (weights_dir / "small_mlp-float32.pt").is_file()


def reference(x: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    tokens = x.reshape(-1, compiled_models.AG_K)
    normed = F.rms_norm(tokens, (compiled_models.AG_K,), weights["norm.weight"])
    return (tokens + F.silu(normed @ weights["w_up"]) @ weights["w_down"]).view_as(x)


def test_the_nccl_eager_mlp_is_the_mlp_and_a_module_torch_export_takes(weights_dir):
    model = compiled_models.ag_mlp_nccl_eager("cpu")
    assert isinstance(model, compiled_models.AgMlp) and model.world == 1
    weights = torch.load(weights_dir / "ag_mlp-float32.pt")
    assert model.w_up.shape == (compiled_models.AG_K, compiled_models.AG_N)
    x = torch.randn(2, 3, compiled_models.AG_K)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x, weights))
        exported = torch.export.export(model, (x,))
    assert {"w_up", "w_down", "norm.weight"} <= set(exported.state_dict)  # weights lifted


def test_the_weights_are_made_per_model_and_device_and_an_unknown_model_refused(weights_dir):
    assert compiled_models.make_weights("ag_mlp_max_autotune", "cpu").name == "ag_mlp-float32.pt"
    assert compiled_models.make_weights("small_mlp", "cuda").name == "small_mlp-float32.pt"
    with pytest.raises(ValueError, match="kernels: no weights"):
        compiled_models.make_weights("kernels", "cpu")
