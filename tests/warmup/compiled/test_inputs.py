"""A model's inputs as the manifest declares them: each dtype name is torch's dtype;
normal or inference tensors, the kinds a model is primed with, by its mode; the
caller's mode named as a manifest names it."""

from __future__ import annotations

import pytest
import torch

from tests.warmup.compiled.models import manifest
from warmup.compiled.inputs import current_mode, input_kinds, make_inputs, torch_dtype
from warmup.core.manifest import parse_manifest

DIMS = {"batch": 2, "seq": 3}


def entry(mode="no_grad"):
    text = manifest(("m", "mlp", "{batch: [1, 2], seq: 3}")).replace(
        "    dims:", f"    mode: {mode}\n    dims:"
    )
    return parse_manifest(text).models[0]


def test_every_declared_dtype_name_is_a_torch_dtype():
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}  # fmt: skip
    assert {name: torch_dtype(name) for name in names} == names
    with pytest.raises(KeyError):
        torch_dtype("fp8")


def test_inference_tensors_are_made_only_when_asked_with_the_same_values():
    model = entry()
    inference, normal = (
        make_inputs(model, DIMS, "cpu", inference=True),
        make_inputs(model, DIMS, "cpu"),
    )
    assert all(t.is_inference() for t in inference)
    assert not any(t.is_inference() for t in normal)
    assert all(torch.equal(a, b) for a, b in zip(normal, inference, strict=True))  # by shape


def test_an_inference_mode_model_is_primed_with_both_kinds_the_others_with_normal_ones():
    assert input_kinds(entry("inference_mode")) == ("normal", "inference")
    assert input_kinds(entry("no_grad")) == input_kinds(entry("grad")) == ("normal",)


@pytest.mark.parametrize(
    ("context", "mode"),
    [
        (torch.inference_mode, "inference_mode"),
        (torch.no_grad, "no_grad"),
        (torch.enable_grad, "grad"),
    ],
)
def test_the_callers_mode_is_named_as_the_manifest_names_it(context, mode):
    with context():
        assert current_mode() == mode
