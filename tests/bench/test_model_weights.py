"""bench/model_weights.py: a weight file made once, and a module made on ``meta`` given
its weights through a memory map."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench import model_weights
from bench.model_weights import ENV, folder, load_into, weights_file


@pytest.fixture
def weights_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "weights"))
    return tmp_path / "weights"


def state() -> dict[str, torch.Tensor]:
    return {"weight": torch.arange(6.0).view(3, 2), "bias": torch.ones(3)}


def test_the_folder_is_the_runs_else_a_temporary_one(weights_dir, monkeypatch):
    assert folder() == weights_dir
    monkeypatch.delenv(ENV)
    assert folder().name == model_weights.DEFAULT


def test_a_weight_file_is_made_once_in_its_dtype_and_nothing_is_left_beside_it(weights_dir):
    made = []

    def make() -> dict[str, torch.Tensor]:
        made.append(1)
        return state()

    path = weights_file("m", torch.float16, make)
    assert path == weights_dir / "m-float16.pt" and weights_file("m", torch.float16, make) == path
    assert len(made) == 1  # the second call reads what the first wrote
    assert torch.load(path)["weight"].dtype == torch.float16
    assert [p.name for p in weights_dir.iterdir()] == ["m-float16.pt"]  # no temp file left
    assert weights_file("m", torch.float32, make).name == "m-float32.pt" and len(made) == 2


def test_a_failed_make_leaves_no_file(weights_dir):
    def broken() -> dict[str, torch.Tensor]:
        raise RuntimeError("no weights")

    with pytest.raises(RuntimeError):
        weights_file("m", torch.float32, broken)
    assert not list(weights_dir.iterdir())


def test_a_module_made_on_meta_takes_every_weight_from_the_file(weights_dir):
    path = weights_file("m", torch.float32, state)
    with torch.device("meta"):
        module = nn.Linear(2, 3).train()
    loaded = load_into(module, path, "cpu")
    assert loaded is module and not module.training
    assert not any(p.is_meta for p in module.parameters())
    assert torch.equal(module.weight, state()["weight"])


def test_select_takes_a_slice_before_it_is_assigned(weights_dir):
    path = weights_file("m", torch.float32, state)
    with torch.device("meta"):
        module = nn.Linear(2, 2)

    def rows(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"weight": full["weight"][1:], "bias": full["bias"][1:]}

    load_into(module, path, "cpu", select=rows)
    assert module.weight.tolist() == [[2.0, 3.0], [4.0, 5.0]] and module.weight.is_contiguous()
    with torch.device("meta"):
        wrong = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_into(wrong, path, "cpu")  # strict: a shape the file does not hold is refused
