"""The base of every served layer: what a kernel's layer gets without stating it."""

from dataclasses import dataclass, field

import pytest
import torch

from kernels.adapter import GEMM_KEY, KernelAdapter, Layer
from kernels.served import ServedLayer
from registry.core.config import KernelConfig

CONFIG = KernelConfig.make({"BLOCK_M": 16})


class FakeAdapter(KernelAdapter):
    def tasks(self, shapes, *, dtype, group, device):
        return iter(())

    def serve(self, layer, *, group, device):
        return TwoRanks(layer, device=device)


@dataclass
class Plan:
    """A launch plan that records what it was made on and whether it was loaded."""

    operands: tuple[torch.Tensor, ...]
    loaded: list[bool] = field(default_factory=list)

    def load(self) -> None:
        self.loaded.append(True)


class TwoRanks(ServedLayer):
    """A layer of two ranks' rows, whose calls and plans are recorded, not run."""

    adapter = FakeAdapter("fake", lambda: "h", key_fields=(*GEMM_KEY, "world"))
    kernel = "fake"

    def __init__(self, layer: Layer, *, device: object) -> None:
        super().__init__(layer, device=device)
        self.rows_step = self.world = 2
        self.calls: list[tuple[KernelConfig, torch.Size, torch.Size]] = []
        self.plans: list[Plan] = []

    def __call__(self, config, a, b, /, *, out=None):
        self.calls.append((config, a.shape, b.shape))
        return a @ b

    def plan(self, a, b, out, config):
        self.plans.append(Plan((a, b, out)))
        return self.plans[-1]

    def default_config(self):
        return CONFIG


def served(device: str = "cpu") -> TwoRanks:
    return TwoRanks(Layer(8, 16, "bf16", 32), device=device)


def test_a_layer_keys_through_its_kernels_adapter_with_its_world():
    assert served().key(6) == {"M": 6, "N": 8, "K": 16, "dtype": "bf16", "world": 2}


def test_a_calls_rows_are_its_rows_from_every_rank():
    assert served().rows(torch.empty(3, 16), torch.empty(16, 8)) == 6


def test_a_warm_up_plan_is_one_row_per_rank_of_meta_tensors_in_the_layers_dtype():
    layer = served()
    a, b, out = layer.warm_up_plan(CONFIG).operands
    assert [tuple(t.shape) for t in (a, b, out)] == [(2, 16), (16, 8), (2, 8)]
    assert all(t.is_meta and t.dtype == torch.bfloat16 for t in (a, b, out))


def test_prepare_loads_the_one_variant_on_a_gpu_and_builds_nothing_on_the_cpu():
    cpu = served()
    cpu.prepare(CONFIG, [2, 4])
    assert cpu.plans == []
    gpu = served("cuda")  # a device name: no GPU is touched until a tensor is made there
    gpu.prepare(CONFIG, [2, 4])
    assert [plan.loaded for plan in gpu.plans] == [[True]]


def test_a_rehearsal_calls_once_per_config_on_one_row_per_rank():
    layer, other = served(), KernelConfig.make({"BLOCK_M": 32})
    layer.rehearse([CONFIG, other])
    assert layer.calls == [(c, torch.Size([1, 16]), torch.Size([16, 8])) for c in (CONFIG, other)]


def test_one_process_agrees_with_itself_without_a_collective():
    layer = served()
    layer.world = 1  # no process group is initialized in this test
    assert layer.agree({"x": 1}) == {"x": 1}
    assert layer.all_true(False) is False and layer.all_true(True) is True


def test_a_layer_must_state_its_call_plan_and_default():
    class Bare(ServedLayer):
        adapter = TwoRanks.adapter

    with pytest.raises(TypeError, match="default_config"):
        Bare(Layer(8, 16, "bf16", 32), device="cpu")
