"""A serving op inside a torch.compile'd model: one opaque custom op (no graph break),
the same result and the same per-call config choice as outside the model."""

from __future__ import annotations

import torch

from tests.warmup.serving.test_ops import N, config, inputs, settings, store  # noqa: F401
from warmup.serving import Serving


def test_a_serving_op_runs_inside_a_fullgraph_compiled_model(settings, store):  # noqa: F811
    with Serving(settings, follow=False) as serving:
        op = serving.op(
            "matmul", n=N, k=inputs(1)[0].shape[1], dtype="fp32", max_m=100, device="cpu"
        )
        layer = op.in_graph()

        def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.relu(layer(a, b)) * 2.0

        compiled = torch.compile(forward, fullgraph=True)  # Inductor; fullgraph: no graph break
        for m in (16, 50):
            a, b = inputs(m)
            torch.testing.assert_close(
                compiled(a, b), torch.relu(a @ b) * 2.0, rtol=1e-3, atol=1e-3
            )
        assert op.calls == [1, 1, 0]  # the op chose per call: tuned at 16, nearest at 50


def test_the_fake_output_has_the_ops_shape_without_running_it(settings, store):  # noqa: F811
    from torch._subclasses.fake_tensor import FakeTensorMode

    with Serving(settings, follow=False) as serving:
        op = serving.op(
            "matmul", n=N, k=inputs(1)[0].shape[1], dtype="fp32", max_m=100, device="cpu"
        )
        layer = op.in_graph()
        with FakeTensorMode() as mode:
            a, b = (mode.from_tensor(t) for t in inputs(32))
            out = layer(a, b)
        assert tuple(out.shape) == (32, N) and out.dtype == torch.float32
        assert op.calls == [0, 0, 0]  # nothing ran


def test_an_ops_name_in_the_graph_does_not_depend_on_the_order_ops_were_made(settings, store):  # noqa: F811
    from warmup.serving.in_graph import op_name

    k = inputs(1)[0].shape[1]
    with Serving(settings, follow=False) as first:
        first.op(
            "matmul", n=N + 8, k=k, dtype="fp32", max_m=100, device="cpu", on_missing="fallback"
        )
        late = op_name(first.op("matmul", n=N, k=k, dtype="fp32", max_m=100, device="cpu"))
    with Serving(settings, follow=False) as second:
        alone = op_name(second.op("matmul", n=N, k=k, dtype="fp32", max_m=100, device="cpu"))
    assert late == alone == f"matmul:n{N}:k{k}:fp32:m100:step1:cpu:solo"
