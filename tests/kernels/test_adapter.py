"""What warmup/ needs of a kernel: the dtype names a manifest uses, and the adapter base
that every kernel's adapter is."""

import importlib

import pytest
import torch

import kernels
from kernels.adapter import (
    DTYPES,
    GEMM_KEY,
    KernelAdapter,
    Layer,
    dtype_name,
    gemm_flops,
    indexed_device,
    torch_dtype,
)
from kernels.served import ServedLayer
from kernels.shapes import RULES


def test_each_dtype_name_stands_for_one_torch_dtype_and_back():
    for name in DTYPES:
        assert dtype_name(torch_dtype(name)) == name
    assert dtype_name(torch.int8) is None  # no kernel takes it
    assert dtype_name("bfloat16") is None  # a name is not a dtype: refused, not guessed


def test_a_device_keeps_its_index_and_a_name_becomes_a_device():
    assert indexed_device("cpu") == torch.device("cpu")
    assert indexed_device(torch.device("cuda", 1)) == torch.device("cuda", 1)  # no GPU asked
    assert indexed_device("cuda:2") == torch.device("cuda", 2)


class Fake(KernelAdapter):
    """An adapter with only what every kernel must state itself."""

    def tasks(self, shapes, *, dtype, group, device):
        return iter(())

    def serve(self, layer, *, group, device):
        raise NotImplementedError


def test_the_base_keys_on_its_fields_in_their_order():
    single = Fake("matmul", lambda: "h")
    assert single.key(m=4, n=8, k=16, dtype="bf16", world=2) == {
        "M": 4, "N": 8, "K": 16, "dtype": "bf16"
    }  # fmt: skip
    gathered = Fake("ag_gemm", lambda: "h", key_fields=(*GEMM_KEY, "world"))
    key = gathered.key(m=4, n=8, k=16, dtype="bf16", world=2)
    assert list(key) == ["M", "N", "K", "dtype", "world"] and key["world"] == 2


def test_the_base_hashes_checks_and_costs_as_its_module_and_rule_say():
    calls = []
    adapter = Fake("ag_gemm", lambda: calls.append(1) or f"hash{len(calls)}")
    assert adapter.kernel_hash() == "hash1" and adapter.kernel_hash() == "hash2"  # asked each time
    assert adapter.check_shape({"M": 6, "N": 8, "K": 8}, world_size=4) == RULES["ag_gemm"].check(
        {"M": 6, "N": 8, "K": 8}, world_size=4
    )
    assert adapter.check_shape({"M": 8, "N": 8, "K": 8}, world_size=4) is None
    assert adapter.tuning_cost({"M": 2, "N": 3, "K": 5}) == gemm_flops({"M": 2, "N": 3, "K": 5})
    with pytest.raises(KeyError):  # a kernel with no shape rule is a programmer's error
        Fake("nameless", lambda: "h").check_shape({"M": 1, "N": 1, "K": 1}, world_size=1)


def test_a_kernel_must_state_its_tasks_and_its_served_layer():
    class Half(KernelAdapter):
        def tasks(self, shapes, *, dtype, group, device):
            return iter(())

    with pytest.raises(TypeError, match="serve"):
        Half("matmul", lambda: "h")


@pytest.mark.parametrize("name", sorted(kernels.ADAPTERS))
def test_every_tables_adapter_is_the_base_named_as_its_row_and_its_layer_keys_through_it(name):
    adapter = kernels.adapter_for(name)
    assert isinstance(adapter, KernelAdapter) and adapter.name == name
    assert adapter.kernel_hash() == importlib.import_module(f"kernels.{name}").kernel_hash()
    served = adapter.serve(Layer(8, 16, "fp32", 4), group=None, device="cpu")
    assert isinstance(served, ServedLayer) and served.adapter is adapter
    assert served.kernel == name
    assert served.key(4) == adapter.key(m=4, n=8, k=16, dtype="fp32", world=1)
