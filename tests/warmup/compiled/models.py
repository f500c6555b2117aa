"""Model builders named by test manifests (``tests.warmup.compiled.models:...``): small
enough that Inductor's CPU backend compiles them in seconds; :func:`manifest` declares
them with the MLP's inputs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

COORDESC = "CachingAutotuner.coordinate_descent_tuning"  # what dynamo_timed records it as


def manifest(*models: tuple[str, str, str]) -> str:
    """A manifest declaring each ``(name, builder in this module, dims)``, every one
    taking the MLP's inputs: ``[batch, seq, 32]`` fp32 and ``[batch]`` int64."""
    entries = "".join(
        f"  - name: {name}\n    build: tests.warmup.compiled.models:{build}\n"
        f"    dims: {dims}\n    inputs:\n      - {{shape: [batch, seq, 32], dtype: fp32}}\n"
        "      - {shape: [batch], dtype: int64, high: 3}\n"
        for name, build, dims in models
    )
    return f"version: 1\nmodels:\n{entries}"


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 48)
        self.down = nn.Linear(48, 16)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, 32], scale: [batch] of int64
        h = torch.nn.functional.silu(self.up(x))
        return self.down(h) * (scale[:, None, None].float() + 1.0)


def mlp(device: Any) -> Any:
    """A compiled two-layer MLP, as a server would build it."""
    torch.manual_seed(0)
    return torch.compile(_Mlp().to(device).eval(), dynamic=False)


def mlp_dynamic(device: Any) -> Any:
    """:func:`mlp` with Dynamo's automatic dynamic shapes (``dynamic=None``, the default)."""
    torch.manual_seed(0)
    return torch.compile(_Mlp().to(device).eval())


def raises(device: Any) -> Any:
    raise RuntimeError("the weights are not there")


def not_callable(device: Any) -> Any:
    return 42


def fails_at_batch_3(device: Any) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 3:
            raise ValueError("batch 3 is not supported")
        return x * 2

    return forward


def asserts_at_batch_2(device: Any) -> Any:
    def forward(x: torch.Tensor, _ids: torch.Tensor) -> torch.Tensor:
        assert x.shape[0] != 2  # a bare assert, as deep in a compiler: no message
        return x * 2

    return forward


def no_device() -> Any:  # a builder a warmup cannot call: it takes no device
    return None


def fails_on_rank_1_at_batch_3(device: Any) -> Any:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0

    def forward(x: torch.Tensor) -> torch.Tensor:
        if rank == 1 and x.shape[0] == 3:
            raise ValueError("rank 1 cannot do batch 3")
        return x + 1

    return forward


def doubles(device: Any) -> Any:
    return lambda x: x * 2


def tunes_at_first_call(device: Any) -> Any:
    """The MLP, with what Inductor's run-time tuning (max-autotune's coordinate descent)
    leaves in its counters: a benchmark counted at each process's first call."""
    from torch._dynamo.utils import compilation_time_metrics

    compiled = mlp(device)
    first = [True]

    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        if first[0]:
            ran = compilation_time_metrics.setdefault(COORDESC, [])
            ran.append(0.0)
            first[0] = False
        return compiled(*inputs)

    return forward


def traced(device: Any) -> Any:
    """The MLP under Dynamo alone (``backend="eager"``): guarded and recompiled as under
    Inductor, with no C++ compile, so a test takes a second."""
    torch.manual_seed(0)
    return torch.compile(_Mlp().to(device).eval(), backend="eager", dynamic=False)


def traced_dynamic(device: Any) -> Any:
    """:func:`traced` with Dynamo's automatic dynamic shapes (``dynamic=None``, the
    default): a size between primed ones shares their graph, but 0 and 1 are specialised."""
    torch.manual_seed(0)
    return torch.compile(_Mlp().to(device).eval(), backend="eager")


GRAD_INSIDE: dict[str, bool | None] = {"enabled": None}
"""The grad mode :func:`sets_its_own_grad_mode`'s forward sets (None: leaves it)."""


def sets_its_own_grad_mode(device: Any) -> Any:
    """:func:`traced` called under the grad mode :data:`GRAD_INSIDE` names: a model's own
    code that changes the mode inside the served call."""
    compiled = traced(device)

    def forward(*inputs: torch.Tensor) -> Any:
        enabled = GRAD_INSIDE["enabled"]
        if enabled is None:
            return compiled(*inputs)
        with torch.set_grad_enabled(enabled):
            return compiled(*inputs)

    return forward


class Counting:
    """A callable that keeps the input shapes of its calls, then calls ``function``."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, *inputs: torch.Tensor) -> Any:
        self.calls.append(tuple(inputs[0].shape))
        return self.function(*inputs)


def counted(device: Any) -> Any:
    """:func:`traced`, counting its calls by shape."""
    return Counting(traced(device))


def counted_plain(device: Any) -> Any:
    """The MLP uncompiled, counting its calls by shape: no call of it ever compiles."""
    torch.manual_seed(0)
    return Counting(_Mlp().to(device).eval())


def misses_at_first_call(device: Any) -> Any:
    """:func:`traced`, with what an Inductor FX-graph cache miss and a coordinate-descent
    benchmark leave in the counters at the process's first call (a compiled prime)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    compiled = traced(device)
    first = [True]

    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        if first[0]:
            counters["inductor"]["fxgraph_cache_miss"] += 1
            compilation_time_metrics.setdefault(COORDESC, []).append(0.0)
            first[0] = False
        return compiled(*inputs)

    return forward


def misses_then_hits(device: Any) -> Any:
    """Doubles its input, with what Inductor's counters show for a graph compiled at the
    first call (an FX-graph cache miss) and loaded from the cache at every later one."""
    from torch._dynamo.utils import counters

    first = [True]

    def forward(x: torch.Tensor) -> torch.Tensor:
        counters["inductor"]["fxgraph_cache_miss" if first[0] else "fxgraph_cache_hit"] += 1
        first[0] = False
        return x * 2

    return forward


class _Branches(nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        # a branch on the data: torch.export cannot capture it in one graph
        if x.mean() > 0:
            return x * scale[:, None, None].float()
        return -x


def specialises(device: Any) -> Any:
    """A compiled module that branches on its data: it does not export."""
    return torch.compile(_Branches().to(device), dynamic=False)


def compiled_twice(device: Any) -> Any:
    """A build that compiles two things: not one package."""
    torch.compile(nn.Linear(2, 2))
    return torch.compile(_Mlp().to(device).eval())
