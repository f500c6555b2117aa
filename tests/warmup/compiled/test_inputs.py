"""A model's inputs as the manifest declares them: each dtype name is torch's dtype."""

from __future__ import annotations

import pytest
import torch

from warmup.compiled.inputs import torch_dtype


def test_every_declared_dtype_name_is_a_torch_dtype():
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}  # fmt: skip
    assert {name: torch_dtype(name) for name in names} == names
    with pytest.raises(KeyError):
        torch_dtype("fp8")
