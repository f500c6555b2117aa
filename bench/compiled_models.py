"""The compiled models of ``bench/compiled_model.py``, built as a server would build
them: the 4-block transformer of issue [3.1] (d=2048, fp16, RMSNorm, SDPA, SwiGLU) with
torch.compile's default mode and ``max-autotune``, the same model uncompiled (the eager
reference), and a small MLP for a CPU run of the bench."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.compiled_model import model_dtype

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


def _blocks(device: Any) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(4)])
    return model.to(device=device, dtype=torch.float16).eval()


def blocks4(device: Any) -> Any:
    return torch.compile(_blocks(device), dynamic=False)


def blocks4_max_autotune(device: Any) -> Any:
    return torch.compile(_blocks(device), dynamic=False, mode="max-autotune")


def blocks4_eager(device: Any) -> Any:
    return _blocks(device)


def small_mlp(device: Any) -> Any:
    return torch.compile(small_mlp_eager(device), dynamic=False)


def small_mlp_eager(device: Any) -> Any:
    """:func:`small_mlp` uncompiled (``bench/pod_ready.py``'s eager case on a CPU)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    return model.to(device).eval()


AG_K, AG_N = 2048, 8192  # the MLP's model width and hidden width
AG_MAX_M = 4096  # tokens per call: batch x seq up to 16 x 256
_serving: Any = None


def ag_mlp(device: Any) -> Any:
    """A compiled MLP block whose two GEMMs are the fused AllGather-GEMM's serving ops
    (world 1), registered custom ops inside the graph: RMSNorm, up, SiLU, down,
    residual. Its layers' configs come from the registry the warmup filled. In a process
    group of more ranks, sequence parallel: up alone is the op (``_ag_mlp_parallel``)."""
    return _ag_mlp(device)


def ag_mlp_max_autotune(device: Any) -> Any:
    """:func:`ag_mlp` compiled with ``mode="max-autotune"`` (its GEMMs stay the ops')."""
    return _ag_mlp(device, mode="max-autotune")


def ag_mlp_eager(device: Any) -> Any:
    """:func:`ag_mlp` uncompiled: the same serving ops called from Python."""
    return _ag_mlp(device, compiled=False)


def _ag_mlp(device: Any, *, compiled: bool = True, **options: Any) -> Any:
    world = _world()
    forward = _ag_mlp_parallel(device, world) if world > 1 else _ag_mlp_one(device)
    if not compiled:
        return forward
    return torch.compile(forward, dynamic=False, fullgraph=True, **options)


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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


def _ag_mlp_one(device: Any) -> Any:
    name, dtype = ag_dtype(device)
    ops = [
        _server().op(
            "ag_gemm", n=n, k=k, dtype=name, max_m=AG_MAX_M, device=device, on_missing="fallback"
        )
        for n, k in ((AG_N, AG_K), (AG_K, AG_N))
    ]
    up, down = (op.in_graph() for op in ops)
    torch.manual_seed(0)
    w_up = torch.randn(AG_K, AG_N, device=device, dtype=dtype) / AG_K**0.5
    w_down = torch.randn(AG_N, AG_K, device=device, dtype=dtype) / AG_N**0.5
    norm = nn.RMSNorm(AG_K).to(device=device, dtype=dtype)

    def forward(x: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, AG_K] -> tokens [M, AG_K]
        tokens = x.reshape(-1, AG_K)
        hidden = F.silu(up(norm(tokens), w_up))  # [M, AG_N]
        return (tokens + down(hidden, w_down)).view_as(x)

    return forward


def _ag_mlp_parallel(device: Any, world: int) -> Any:
    """The MLP at ``world`` ranks, sequence parallel (``bench.compiled_model.ag_layers``):
    each rank holds its own tokens and 1/world of the hidden width; up is the
    AllGather-GEMM's serving op (every rank's tokens, this rank's columns), down a local
    GEMM whose partial sums a reduce-scatter adds up and hands back to each rank."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    width, rank = AG_N // world, dist.get_rank()
    group: Any = dist.group.WORLD
    name, dtype = ag_dtype(device)
    op = _server().op(
        "ag_gemm", n=width, k=AG_K, dtype=name, max_m=AG_MAX_M * world, device=device,
        on_missing="fallback",
    )  # fmt: skip
    up = op.in_graph()
    torch.manual_seed(0)  # the same full weights on every rank; each keeps its slice
    w_up = torch.randn(AG_K, AG_N, device=device, dtype=dtype) / AG_K**0.5
    w_down = torch.randn(AG_N, AG_K, device=device, dtype=dtype) / AG_N**0.5
    mine = slice(rank * width, (rank + 1) * width)
    w_up, w_down = w_up[:, mine].contiguous(), w_down[mine].contiguous()
    norm = nn.RMSNorm(AG_K).to(device=device, dtype=dtype)

    def forward(x: torch.Tensor) -> torch.Tensor:
        # x: [batch, seq, AG_K], this rank's tokens -> [m, AG_K]
        tokens = x.reshape(-1, AG_K)
        hidden = F.silu(up(norm(tokens), w_up))  # [world * m, width]: every rank's tokens
        partial = hidden @ w_down  # [world * m, AG_K]: this rank's share of each sum
        mixed: torch.Tensor = funcol.reduce_scatter_tensor(partial, "sum", 0, group)  # [m, AG_K]
        return (tokens + mixed).view_as(x)

    return forward
