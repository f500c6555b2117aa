"""Why a call of a primed model compiled: each difference from what priming ran named,
with its fix, read from the call's inputs against the manifest's entry; Dynamo's
reasons for what the inputs cannot show."""

from __future__ import annotations

import pytest
import torch

from tests.warmup.compiled.models import manifest
from warmup.compiled.causes import dynamo_reasons, explain
from warmup.compiled.inputs import make_inputs
from warmup.core.manifest import parse_manifest


def entry(dims="{batch: [2, 4], seq: 3}", mode="no_grad"):
    """The MLP's entry: ``[batch, seq, 32]`` fp32 and ``[batch]`` int64."""
    text = manifest(("m", "mlp", dims)).replace("    dims:", f"    mode: {mode}\n    dims:")
    return parse_manifest(text).models[0]


def said(causes):
    return [(cause.kind, str(cause)) for cause in causes]


def test_a_primed_call_has_no_cause_but_the_unknown_one_with_dynamos_reason():
    model = entry()
    [cause] = explain(model, make_inputs(model, {"batch": 2, "seq": 3}, "cpu"), reasons=["0/1: x"])
    assert cause.kind == "unknown"
    assert "nothing the manifest declares differs from priming" in cause.said
    assert cause.said.endswith("; Dynamo: 0/1: x") and "TORCH_LOGS=recompiles" in cause.fix


def test_a_compile_without_a_new_graph_is_a_run_time_one():
    model = entry()
    inputs = make_inputs(model, {"batch": 2, "seq": 3}, "cpu")
    assert [c.kind for c in explain(model, inputs, new_graph=False)] == ["run time"]


@pytest.mark.parametrize(
    ("dims", "batch", "shown", "fix"),
    [
        ("{batch: [2, 4], seq: 3}", 5, "2, 4", "add 5 to the model's dim batch in the manifest"),
        ("{batch: {pow2: [2, 8]}, seq: 3}", 1, "powers of two from 2 to 8", "add 1 to"),
        ("{batch: {start: 2, stop: 9, step: 3}, seq: 3}", 3, "2 to 8 by 3", "add 3 to"),
        ("{batch: [2, 3, 4, 5, 6, 7, 8, 9, 10], seq: 3}", 1, "2, 3, 4, 5, 6, 7, 8, 9, ...", ""),
    ],
)
def test_an_undeclared_dim_is_named_with_its_value_what_is_declared_and_the_fix(
    dims, batch, shown, fix
):
    model = entry(dims)
    [cause] = explain(model, make_inputs(model, {"batch": batch, "seq": 3}, "cpu"))
    assert cause.kind == "shape"
    assert cause.said.startswith(f"batch={batch} is not declared (the manifest's batch: {shown})")
    assert ("Dynamo specialises sizes 0 and 1" in cause.said) == (batch == 1)
    assert cause.fix.startswith(fix)


def test_an_empty_batch_is_named_and_cannot_be_declared():
    model = entry()
    [cause] = explain(model, [torch.zeros(0, 3, 32), torch.zeros(0, dtype=torch.int64)])
    assert cause.said.startswith("batch=0 is not declared") and "0 and 1" in cause.said
    assert cause.fix == "skip the call when batch is 0 (a dim is declared from 1)"


def test_a_learned_shape_primed_is_no_cause():
    model = entry()
    inputs = make_inputs(model, {"batch": 5, "seq": 3}, "cpu")
    assert [c.kind for c in explain(model, inputs, learned=[{"batch": 5, "seq": 3}])] == ["unknown"]


def test_inputs_other_than_declared_are_named():
    model = entry()
    x, ids = make_inputs(model, {"batch": 2, "seq": 3}, "cpu")
    assert said(explain(model, [x.half(), ids.int()])) == [
        ("dtype", "input 0 [batch, seq, 32] is torch.float16, the manifest declares fp32 "
                  "(fix: declare dtype fp16 or cast it)"),
        ("dtype", "input 1 [batch] is torch.int32, the manifest declares int64 "
                  "(fix: declare dtype int32 or cast it)"),
    ]  # fmt: skip
    assert said(explain(model, [torch.zeros(2, 3, 64), ids])) == [
        ("shape", "input 0 [batch, seq, 32] has size 64 at axis 2, the manifest declares 32 "
                  "(fix: declare 64 (or a dim) at axis 2)"),
    ]  # fmt: skip
    [rank] = explain(model, [torch.zeros(2, 32), ids])
    assert rank.said == "input 0 [batch, seq, 32] has 2 dims ([2, 32]), the manifest 3"
    kinds = [c.kind for c in explain(model, [x], kwargs=["scale"])]
    assert kinds == ["inputs", "inputs"]  # one input fewer; a keyword argument
    [scalar] = explain(model, [x, 3])
    assert scalar.said == "input 1 [batch] is int, not a tensor as the manifest declares"
    [split] = explain(model, [x, ids[:1]])
    assert split.said == "batch is 2 in an earlier input and 1 in input 1"


def test_inference_tensors_are_a_cause_only_where_priming_used_normal_ones():
    with torch.inference_mode():
        inputs = make_inputs(entry(), {"batch": 2, "seq": 3}, "cpu")
    [cause] = explain(entry(), inputs, caller="no_grad")
    assert cause.kind == "tensor kind" and "(the caller is in it)" not in cause.said
    assert explain(entry(mode="inference_mode"), inputs, new_graph=False)[0].kind == "run time"


def test_dynamos_grad_mode_reason_names_the_mode_and_the_callers():
    model = entry()
    inputs = make_inputs(model, {"batch": 2, "seq": 3}, "cpu")
    reasons = ["0/2: GLOBAL_STATE changed: grad_mode "]
    [cause] = explain(model, inputs, caller="no_grad", reasons=reasons)
    assert cause.kind == "grad mode" and "(mode: no_grad; Dynamo:" in cause.said


def test_dynamo_says_why_it_recompiled():
    torch._dynamo.reset()

    @torch.compile(backend="eager", dynamic=False)
    def double(x):
        return x * 2

    double(torch.ones(2))
    assert dynamo_reasons(1) == []  # a first compile has no reason
    double(torch.ones(3))
    [reason] = dynamo_reasons(1)
    assert "size mismatch at index 0" in reason
    assert dynamo_reasons(0) == []
