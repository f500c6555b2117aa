"""A served model primed for what servers send: batch 1 where the declared range has it,
and inference tensors for a model declared ``inference_mode``, so that neither compiles
after warm; each kind of input primed until steady."""

from __future__ import annotations

import pytest
import torch

from tests.warmup.serving.test_models import costs_of, environment, served  # noqa: F401
from warmup.compiled.inputs import make_inputs
from warmup.serving.priming import PRIME_CALLS

SERVER = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def server_call(model, dims, mode):
    """The compile costs of a call at ``dims`` as a server of ``mode`` makes it: its
    inputs made, and the model called, inside that mode (inference tensors in
    ``inference_mode``)."""
    with SERVER[mode]():
        inputs = make_inputs(model.entry, dims, "cpu")
        return costs_of(lambda: model(*inputs))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_batch_1_call_inside_the_declared_range_compiles_nothing_after_warm(tmp_path, mode):
    model, _ = served(tmp_path, "traced_dynamic", mode, dims="{batch: {pow2: [1, 8]}, seq: 3}")
    for batch in (1, 3, 8, 1):
        assert server_call(model, {"batch": batch, "seq": 3}, mode) == {}, batch


def test_an_inference_mode_call_of_an_inference_mode_model_compiles_nothing(tmp_path):
    model, _ = served(tmp_path, "traced", "inference_mode")
    for dims in model.entry.expand():
        assert server_call(model, dims, "inference_mode") == {}, dims
        # normal tensors, made outside the mode (a tokenizer's), hit their own graphs
        normal = make_inputs(model.entry, dims, "cpu")
        assert costs_of(lambda normal=normal: model(*normal)) == {}, dims


@pytest.mark.parametrize(("mode", "kinds"), [("no_grad", 1), ("grad", 1), ("inference_mode", 2)])
def test_each_kind_of_input_is_primed_until_steady(tmp_path, mode, kinds):
    model, _ = served(tmp_path, "counted", mode)
    shapes = [(1, 3, 32), (2, 3, 32)]
    # per shape and kind: the first call traces, the second compiles nothing
    assert model.function.calls == [s for s in shapes for _ in range(2 * kinds)]
    assert model.primed is not None and model.primed.calls == 4 * kinds <= 2 * PRIME_CALLS * kinds
