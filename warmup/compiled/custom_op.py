"""Serving ops inside a ``torch.compile``d model: one registered custom op,
``torch.ops.triton_warmup.serve(op_id, a, b)``, runs whichever serving op ``op_id``
names. Dynamo sees an opaque call with a known output (no graph break, no trace into
the kernel's launcher, its table or its collectives); the serving op picks its config
per call as it does outside a compiled model.

    qkv = serving.op("ag_gemm", n=1536, k=4096, dtype="bf16", max_m=8192, group=tp)
    qkv_in_graph = qkv.in_graph()     # a callable for the model's forward
    y = qkv_in_graph(x_shard, w_qkv)  # [M, N] inside torch.compile, fullgraph or not

The output is ``[a.shape[0] * rows_step, n]`` in ``a``'s dtype and device (a gather
kernel's M counts every rank's rows), a new tensor that aliases no input.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmup.serving import ServingOp

LIBRARY = "triton_warmup"
_ops: list[ServingOp] = []  # op id -> the serving op (process-wide; never removed)
_lock = threading.Lock()
_registered: Any = None


def in_graph(op: ServingOp) -> Any:
    """A callable ``(a, b) -> out`` that runs ``op`` through the registered custom op."""
    serve = _custom_op()
    with _lock:
        _ops.append(op)
        op_id = len(_ops) - 1

    def call(a: Any, b: Any) -> Any:
        return serve(op_id, a, b)

    call.__name__ = f"{op.kernel}_in_graph"
    return call


def _custom_op() -> Any:
    """``torch.ops.triton_warmup.serve``, registered once per process."""
    global _registered
    with _lock:
        if _registered is None:
            _registered = _register()
    return _registered


def _register() -> Any:
    import torch

    @torch.library.custom_op(  # type: ignore[misc]
        f"{LIBRARY}::serve",
        mutates_args=(),
        schema="(int op_id, Tensor a, Tensor b) -> Tensor",  # annotations here are strings
    )
    def serve(op_id: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _ops[op_id](a, b)
        return out if out._base is None else out.clone()  # a custom op's output owns its data

    @serve.register_fake  # type: ignore[misc]
    def _(op_id: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        op = _ops[op_id]
        return a.new_empty((a.shape[0] * op.step, op.layer.n))

    return torch.ops.triton_warmup.serve
