"""The compiled models of ``bench/compiled_model.py`` and ``bench/pod_ready.py``, built as a
server would build them: the 4-block transformer of issue [3.1] (d=2048, fp16, RMSNorm,
SDPA, SwiGLU) with torch.compile's default mode and ``max-autotune``, the same model
uncompiled (the eager reference), the AllGather-GEMM MLP (the same three ways, and with
NCCL + cuBLAS in place of the serving op), and a small MLP for a CPU run of the bench.
Every model is made on the ``meta`` device and takes its weights from a file
(``bench.model_weights``), as a server loads its checkpoint."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.compiled_model import model_dtype
from bench.model_weights import load_into, weights_file

D_MODEL, HEADS, FFN = 2048, 16, 5504


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.out = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.ffn_norm = nn.RMSNorm(D_MODEL)
        self.gate_up = nn.Linear(D_MODEL, 2 * FFN, bias=False)
        self.down = nn.Linear(FFN, D_MODEL, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, D_MODEL]
        batch, seq, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(D_MODEL, dim=-1)
        heads = [t.view(batch, seq, HEADS, -1).transpose(1, 2) for t in (q, k, v)]
        attn = F.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(batch, seq, D_MODEL))
        gate, up = self.gate_up(self.ffn_norm(x)).split(FFN, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _blocks_state() -> dict[str, torch.Tensor]:
    """The 4 blocks' weights as they were made before [5.2]: seeded, on the CPU."""
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(4)]).state_dict()


def _blocks(device: Any) -> nn.Module:
    with torch.device("meta"):  # no initialisation: the weights are loaded
        model = nn.Sequential(*[Block() for _ in range(4)]).to(dtype=torch.float16)
    loaded: nn.Module = load_into(
        model, weights_file("blocks4", torch.float16, _blocks_state), device
    )
    return loaded


def blocks4(device: Any) -> Any:
    return torch.compile(_blocks(device), dynamic=False)


def blocks4_max_autotune(device: Any) -> Any:
    return torch.compile(_blocks(device), dynamic=False, mode="max-autotune")


def blocks4_eager(device: Any) -> Any:
    return _blocks(device)


def small_mlp(device: Any) -> Any:
    return torch.compile(small_mlp_eager(device), dynamic=False)


def _small_mlp_module() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))


def _small_mlp_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return _small_mlp_module().state_dict()


def small_mlp_eager(device: Any) -> Any:
    """:func:`small_mlp` uncompiled (``bench/pod_ready.py``'s eager case on a CPU)."""
    with torch.device("meta"):
        model = _small_mlp_module()
    return load_into(model, weights_file("small_mlp", torch.float32, _small_mlp_state), device)


AG_K, AG_N = 2048, 8192  # the MLP's model width and hidden width
AG_MAX_M = 4096  # tokens per call: batch x seq up to 16 x 256
_serving: Any = None
Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (a, b) -> a @ b, maybe gathered


class AgMlp(nn.Module):
    """The MLP block of the AllGather-GEMM serving ops: RMSNorm, up, SiLU, down,
    residual, its weights parameters (``torch.export`` lifts them; a package takes
    them from the module). ``up`` and ``down`` are GEMMs ``(a, b) -> out``: the serving
    ops' in-graph callables, or torch's. At ``world`` > 1, sequence parallel
    (``bench.compiled_model.ag_layers``): each rank holds its own tokens and 1/world of
    the hidden width; ``up`` gathers every rank's tokens, ``down`` is a local GEMM whose
    partial sums a reduce-scatter adds up and hands back to each rank."""

    def __init__(self, up: Gemm, down: Gemm, world: int = 1) -> None:
        super().__init__()
        width = AG_N // world
        self.norm = nn.RMSNorm(AG_K)
        self.w_up = nn.Parameter(torch.empty(AG_K, width), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(width, AG_K), requires_grad=False)
        self.up, self.down, self.world = up, down, world
        self.group: Any = _group_name() if world > 1 else ""  # a name: Dynamo, export take it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, AG_K], this rank's tokens -> [m, AG_K]
        tokens = x.reshape(-1, AG_K)
        hidden = F.silu(self.up(self.norm(tokens), self.w_up))  # [world * m, width]
        if self.world == 1:
            return (tokens + self.down(hidden, self.w_down)).view_as(x)
        from torch.distributed import _functional_collectives as funcol

        partial = self.down(hidden, self.w_down)  # [world * m, AG_K]: this rank's share
        mixed: torch.Tensor = funcol.reduce_scatter_tensor(partial, "sum", 0, self.group)  # [m, K]
        return (tokens + mixed).view_as(x)


def _ag_state() -> dict[str, torch.Tensor]:
    """The MLP's full weights (every rank reads them and keeps its slice)."""
    generator = torch.Generator().manual_seed(0)
    return {
        "norm.weight": torch.ones(AG_K),
        "w_up": torch.randn(AG_K, AG_N, generator=generator) / AG_K**0.5,
        "w_down": torch.randn(AG_N, AG_K, generator=generator) / AG_N**0.5,
    }


def ag_mlp(device: Any) -> Any:
    """A compiled MLP block whose GEMMs are the fused AllGather-GEMM's serving ops,
    registered custom ops inside the graph (:class:`AgMlp`): both at world 1; in a
    process group of more ranks, up alone. Its layers' configs come from the registry
    the warmup filled."""
    return _ag_mlp(device)


def ag_mlp_max_autotune(device: Any) -> Any:
    """:func:`ag_mlp` compiled with ``mode="max-autotune"`` (its GEMMs stay the ops')."""
    return _ag_mlp(device, mode="max-autotune")


def ag_mlp_eager(device: Any) -> Any:
    """:func:`ag_mlp` uncompiled: the same serving ops called from Python."""
    return _ag_mlp(device, compiled=False)


def ag_mlp_nccl_eager(device: Any) -> Any:
    """:func:`ag_mlp` uncompiled with torch's GEMMs in place of the serving ops: up
    gathers the ranks' tokens with NCCL (``all_gather_into_tensor``) then multiplies
    (cuBLAS), down multiplies. No serving op and no ``Serving`` is made: what a server
    costs with neither this product's op nor a compile (``bench/pod_ready.py``'s
    ``nccl_eager``)."""
    world = _world()
    up = functools.partial(_gathered_matmul, world=world) if world > 1 else torch.matmul
    return _made(up, torch.matmul, world, device)


def _gathered_matmul(a_shard: torch.Tensor, b: torch.Tensor, *, world: int) -> torch.Tensor:
    """Every rank's rows of ``a`` gathered, times ``b``: the NCCL + cuBLAS baseline."""
    import torch.distributed as dist

    # a_shard: [m, K] -> a: [world * m, K]
    a = a_shard.new_empty(world * a_shard.shape[0], a_shard.shape[1])
    dist.all_gather_into_tensor(a, a_shard.contiguous())
    return torch.matmul(a, b)


def _ag_mlp(device: Any, *, compiled: bool = True, **options: Any) -> Any:
    world = _world()
    ops = _ops(device, world)
    module = _made(ops[0], ops[1] if world == 1 else torch.matmul, world, device)
    if not compiled:
        return module
    return torch.compile(module, dynamic=False, fullgraph=True, **options)


def _made(up: Gemm, down: Gemm, world: int, device: Any) -> AgMlp:
    """The MLP made on ``meta``, then given its weights on ``device``: this rank's slices
    of the MLP's, in the dtype its manifests declare."""
    _, dtype = ag_dtype(device)
    with torch.device("meta"):  # no initialisation: the weights are loaded
        module = AgMlp(up, down, world).to(dtype=dtype)
    width, mine = AG_N // world, _rank()
    cols = slice(mine * width, (mine + 1) * width)

    def slices(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**state, "w_up": state["w_up"][:, cols], "w_down": state["w_down"][cols]}

    path = weights_file("ag_mlp", dtype, _ag_state)
    loaded: AgMlp = load_into(module, path, device, select=slices if world > 1 else None)
    return loaded


def _ops(device: Any, world: int) -> list[Gemm]:
    """The serving ops' in-graph callables: up and down at world 1, up at more ranks
    (every rank's tokens, this rank's 1/world of the hidden width)."""
    name, _ = ag_dtype(device)
    if world == 1:
        layers = [(AG_N, AG_K, AG_MAX_M), (AG_K, AG_N, AG_MAX_M)]
    else:
        layers = [(AG_N // world, AG_K, AG_MAX_M * world)]
    return [
        _server()
        .op("ag_gemm", n=n, k=k, dtype=name, max_m=max_m, device=device, on_missing="fallback")
        .in_graph()
        for n, k, max_m in layers
    ]


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _group_name() -> str:
    import torch.distributed as dist

    return str(dist.group.WORLD.group_name)  # type: ignore[union-attr]


def _server() -> Any:
    """This process's ``Serving``, made once."""
    global _serving
    from warmup.serving import Serving

    if _serving is None:
        _serving = Serving(follow=False)
    return _serving


def ag_dtype(device: Any) -> tuple[str, torch.dtype]:
    """The AllGather-GEMM MLP's dtype on ``device``, by name and as torch's: the one its
    manifests declare (``bench.compiled_model.model_dtype``)."""
    name = model_dtype(torch.device(device).type)
    return name, {"fp16": torch.float16, "fp32": torch.float32}[name]


def make_weights(model: str, device: str) -> Path:
    """The weight file of the bench model ``model`` (a name of ``bench/pod_ready.py``:
    ``blocks4``, ``ag_mlp_max_autotune``...) on ``device`` (a device type), made if it
    is not there: what a run makes once, before any pod."""
    if model.startswith("blocks4"):
        return weights_file("blocks4", torch.float16, _blocks_state)
    if model.startswith("ag_mlp"):
        return weights_file("ag_mlp", ag_dtype(device)[1], _ag_state)
    if model == "small_mlp":
        return weights_file("small_mlp", torch.float32, _small_mlp_state)
    raise ValueError(
        f"{model}: no weights; the models with weights are blocks4*, ag_mlp*, small_mlp"
    )
