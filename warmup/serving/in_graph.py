"""Serving ops inside a ``torch.compile``d model: one registered custom op,
``torch.ops.triton_warmup.serve(op, a, b)``, runs whichever serving op ``op`` names.
The name says what the op is (kernel, layer, rows step, device, the group's ranks), not
when it was made: it is a constant of the traced graph, so the warmup's process and the
server's, making their ops in any order, compile the same graph and hit the same cache.
Dynamo sees an opaque call with a known output (no graph break, no trace into the
kernel's launcher, its table or its collectives); the serving op picks its config per
call as it does outside a compiled model.

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
    from warmup.serving.serving_op import ServingOp

LIBRARY = "triton_warmup"
_ops: dict[str, ServingOp] = {}  # name -> the serving op (process-wide; the latest made)
_lock = threading.Lock()
_registered: Any = None
_libraries: list[Any] = []


def in_graph(op: ServingOp) -> Any:
    """A callable ``(a, b) -> out`` that runs ``op`` through the registered custom op."""
    serve = _custom_op()
    name = op_name(op)
    with _lock:
        _ops[name] = op  # the same layer made again serves from its newest table

    def call(a: Any, b: Any) -> Any:
        return serve(name, a, b)

    call.__name__ = f"{op.kernel}_in_graph"
    return call


def op_name(op: ServingOp) -> str:
    """What ``op`` is, as a name that does not depend on the order ops were made."""
    layer, served = op.layer, op.served
    ranks = _group_ranks(served.group, op.step)
    return (
        f"{op.kernel}:n{layer.n}:k{layer.k}:{layer.dtype}:m{layer.max_m}:"
        f"step{op.step}:{served.device}:{ranks}"
    )


def _group_ranks(group: Any, world: int) -> str:
    """The global ranks of a tensor-parallel group (two groups of a pod differ)."""
    if world == 1 or group is None:
        return "solo"
    import torch.distributed as dist  # torch loads on first use

    return "r" + "-".join(map(str, dist.get_process_group_ranks(group)))


def _custom_op() -> Any:
    """``torch.ops.triton_warmup.serve``, registered once per process."""
    global _registered
    with _lock:
        if _registered is None:
            _registered = _register()
    return _registered


def _register() -> Any:
    """The op defined through ``torch.library.Library``: ``torch.library.custom_op``
    would wrap its kernel in Dynamo's ``disable``, whose first call imports Dynamo
    (seconds), in a server that loads a compiled package and compiles nothing."""
    import torch  # torch loads on first use

    library = torch.library.Library(LIBRARY, "FRAGMENT")  # type: ignore[no-untyped-call]
    library.define("serve(str op, Tensor a, Tensor b) -> Tensor")  # type: ignore[no-untyped-call]

    def serve(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _ops[op](a, b)
        return out if out._base is None else out.clone()  # a custom op's output owns its data

    def fake(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        made = _ops[op]
        return a.new_empty((a.shape[0] * made.step, made.layer.n))

    library.impl("serve", serve, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"{LIBRARY}::serve", fake, lib=library)
    _libraries.append(library)  # the registration lives as long as its library
    return torch.ops.triton_warmup.serve
