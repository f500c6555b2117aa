"""A model built with torch.compile stood in for: the module it was handed, the options
it asked for, and why a build cannot become a package."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.warmup.compiled.models import manifest
from warmup.compiled.uncompiled import build_uncompiled
from warmup.core.manifest import parse_manifest


def entry(build: str):
    text = manifest(("m", build, "{batch: [1, 2], seq: 3}"))
    return parse_manifest(text).model("m")


def test_the_module_handed_to_torch_compile_comes_back_with_its_options():
    built = build_uncompiled(entry("mlp"), "cpu")
    assert isinstance(built.model, torch.nn.Module)
    assert not hasattr(built.model, "_orig_mod")  # not Dynamo's wrapper
    assert built.options == {"dynamic": False} and built.unpackaged == ""
    assert torch.compile.__module__ == "torch"  # the real one is back


def test_a_build_that_cannot_be_a_package_says_why():
    assert "backend 'eager'" in build_uncompiled(entry("traced"), "cpu").unpackaged
    assert "2 times" in build_uncompiled(entry("compiled_twice"), "cpu").unpackaged
    assert "not a torch.nn.Module" in build_uncompiled(entry("doubles"), "cpu").unpackaged


def test_a_build_that_raises_is_a_value_error():
    with pytest.raises(ValueError, match="raised RuntimeError: the weights are not there"):
        build_uncompiled(entry("raises"), "cpu")
    with pytest.raises(ValueError, match="not a callable"):
        build_uncompiled(entry("not_callable"), "cpu")


def test_building_imports_no_compiler():  # in a fresh process: others may have imported it
    code = (
        "import sys; from tests.warmup.compiled.test_uncompiled import entry; "
        "from warmup.compiled.uncompiled import build_uncompiled; "
        "build_uncompiled(entry('mlp'), 'cpu'); "
        "print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr[-2000:]


def test_a_weight_is_found_by_its_dotted_name():
    from warmup.compiled.uncompiled import module_tensor

    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    model.register_buffer("scale", torch.ones(3))
    model.plain = torch.zeros(1)  # a tensor attribute, lifted as a constant by export
    assert module_tensor(model, "0.weight") is model[0].weight
    assert module_tensor(model, "scale") is model.scale
    assert module_tensor(model, "plain") is model.plain
    assert module_tensor(model, "0.missing") is None and module_tensor(model, "1.weight") is None
