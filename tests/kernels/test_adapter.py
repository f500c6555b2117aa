"""What warmup/ needs of a kernel: the dtype names a manifest uses."""

import torch

from kernels.adapter import DTYPES, dtype_name, indexed_device, torch_dtype


def test_each_dtype_name_stands_for_one_torch_dtype_and_back():
    for name in DTYPES:
        assert dtype_name(torch_dtype(name)) == name
    assert dtype_name(torch.int8) is None  # no kernel takes it
    assert dtype_name("bfloat16") is None  # a name is not a dtype: refused, not guessed


def test_a_device_keeps_its_index_and_a_name_becomes_a_device():
    assert indexed_device("cpu") == torch.device("cpu")
    assert indexed_device(torch.device("cuda", 1)) == torch.device("cuda", 1)  # no GPU asked
    assert indexed_device("cuda:2") == torch.device("cuda", 2)
