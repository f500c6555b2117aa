"""The AllGather-GEMM's launcher: :func:`ag_gemm` checks its inputs and runs the
algorithm its config names (see :mod:`kernels.ag_gemm`); the fused one launches a
consumer of :mod:`kernels.ag_gemm_kernels` over the workspace's rows.

Nothing here picks a config or tunes: a config comes from the registry or the tuner.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import ag_gemm_workspace as workspace
from kernels.adapter import LaunchPlan
from kernels.ag_gemm_kernels import _ag_gemm_portable_kernel, _ag_gemm_tma_kernel, _wait_kernel
from kernels.ag_gemm_workspace import AgGemmContext
from kernels.spaces import meta_int
from registry.core.config import KernelConfig


def check_inputs(
    a_shard: torch.Tensor, b: torch.Tensor, ctx: AgGemmContext, out: torch.Tensor | None = None
) -> tuple[int, int, int]:
    """Raise ``ValueError`` naming what is wrong; returns (M, N, K) of the gathered GEMM.

    On the request path: the common case is a handful of attribute reads (about 1 us of
    host time); the messages are made only for a call that fails."""
    a_shape, b_shape = a_shard.shape, b.shape
    if (
        len(a_shape) != 2
        or len(b_shape) != 2
        or b_shape[0] != a_shape[1]
        or a_shard.dtype is not ctx.dtype
        or b.dtype is not ctx.dtype
        or a_shard.get_device() != ctx.device_index
        or b.get_device() != ctx.device_index
        or not a_shard.is_contiguous()
        or not b.is_contiguous()
    ):
        _check_operands(a_shard, b, ctx)
    m_per_rank, k = a_shape
    m = m_per_rank * ctx.world
    if k != ctx.k or m > ctx.max_m or m_per_rank == 0:
        raise ValueError(
            f"ag_gemm: gathered shape [{m}, {k}] exceeds the context's "
            f"[{ctx.max_m}, {ctx.k}] (K must match, M at most max_m)."
        )
    n = b_shape[1]
    if out is not None and (
        out.shape != (m, n) or out.dtype is not ctx.dtype or not out.is_contiguous()
    ):
        raise ValueError(
            f"ag_gemm: out is {tuple(out.shape)} {out.dtype}; need a contiguous "
            f"[{m}, {n}] {ctx.dtype}."
        )
    return m, n, k


def _check_operands(a_shard: torch.Tensor, b: torch.Tensor, ctx: AgGemmContext) -> None:
    """The operands alone: 2-D, row-major, of one K, of the context's dtype and device."""
    if a_shard.ndim != 2 or b.ndim != 2:
        raise ValueError(
            f"ag_gemm: a_shard {tuple(a_shard.shape)} and b {tuple(b.shape)} must be 2-D."
        )
    m_per_rank, k = a_shard.shape
    if b.shape[0] != k:
        raise ValueError(
            f"ag_gemm: a_shard is [{m_per_rank}, {k}] but b is "
            f"{list(b.shape)}; b must be [K={k}, N]."
        )
    if a_shard.dtype != ctx.dtype or b.dtype != ctx.dtype:
        raise ValueError(
            f"ag_gemm: dtypes a_shard {a_shard.dtype}, b {b.dtype}; the context "
            f"was made for {ctx.dtype}."
        )
    if not a_shard.is_contiguous() or not b.is_contiguous():
        raise ValueError(
            "ag_gemm: a_shard and b must be contiguous (row-major); call .contiguous() first."
        )
    if a_shard.device != ctx.device or b.device != ctx.device:
        raise ValueError(
            f"ag_gemm: tensors on {a_shard.device} and {b.device}; the context is on {ctx.device}."
        )


# The algorithms a config chooses (``KernelConfig.algorithm``); the tuner times them all
# and the registry stores the winner, which is the baseline unless another beats it.
FUSED = "fused_pull"  # copy-engine pushes overlapped with a Triton consumer (ag_gemm_kernels)
BASELINE = "nccl_cublas"  # NCCL all-gather, then one cuBLAS GEMM: what the op replaces
GATHER_FIRST = "gather_cublas"  # small M: every shard through symmetric memory, one GEMM
OVERLAP = "overlap_cublas"  # one cuBLAS GEMM per shard, each as soon as its rows land
ALGORITHMS = (BASELINE, GATHER_FIRST, OVERLAP, FUSED)
LIBRARY = (BASELINE, GATHER_FIRST, OVERLAP)  # no meta-parameters: one config each
BASELINE_CONFIG = KernelConfig.make(algorithm=BASELINE)
# torch 2.13 renames all_gather_into_tensor (and warns on the old name); 2.11 has only it
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# a launch then returns when its kernel ends: a consumer launched before this rank's
# pushes would wait for them forever (see _run_fused)
LAUNCH_BLOCKING = os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0")


def algorithm_of(config: KernelConfig) -> str:
    """The algorithm ``config`` runs: a config stored before algorithms existed (None)
    is a fused one, the only algorithm there was."""
    return config.algorithm or FUSED


def ag_gemm(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    ctx: AgGemmContext,
    config: KernelConfig,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``all_gather(a_shard) @ b`` with ``config``'s algorithm; a collective: every rank
    calls it with the same algorithm. Capturable in a CUDA graph: a replay is a call.

    a_shard: [M/world, K], b: [K, N] -> [M, N]. The config comes from the registry or
    the tuner; nothing here picks one. A call adds to its algorithm's own calls the
    checks of its inputs and a dict lookup (docs/benchmarks/ag_gemm.md: what a call costs).
    """
    m, n, _ = check_inputs(a_shard, b, ctx, out)
    run = _RUNS.get(algorithm_of(config)) or run_for(config)
    if out is None:
        out = torch.empty(m, n, dtype=ctx.dtype, device=ctx.device)
    ctx.calls += 1
    if ctx.world == 1:
        if run is _run_fused:
            _launch_fused(ctx, a_shard, b, out, a_shard.shape[0], config)
        else:  # nothing to gather
            torch.mm(a_shard, b, out=out)
        return out
    run(ctx, a_shard, b, out, config)
    return out


def _run_fused(
    ctx: AgGemmContext, a_shard: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Any
) -> None:
    """The consumer GEMM starts on its own rows and waits tile by tile for the peers',
    which the side stream pushes meanwhile. On a warm call the consumer is launched
    first: its launch (Triton's launcher, the TMA descriptors) is the costliest host
    step of a call, and a call issued just in time starts its main kernel that much
    sooner; the pushes need no SM and start at the barrier. The pushes go first where
    the launch may not return before the kernel ends or may take long: on the CPU (the
    interpreter runs the consumer to its end), under ``CUDA_LAUNCH_BLOCKING=1``, and at
    a config's first call at a layout (it compiles or loads the kernel while the peers'
    consumers wait for this rank's rows)."""
    at = workspace.arm_and_meet(ctx, a_shard)
    key = _fused_key(ctx, config, at.g, b, out)
    consumer_first = key is not None and key in ctx.cache and not LAUNCH_BLOCKING
    if not consumer_first:
        workspace.push_aside(ctx, a_shard, at)
    with _settled_on_error(ctx, at, unpushed=a_shard if consumer_first else None):
        _launch_fused(ctx, at.g, b, out, a_shard.shape[0], config, key=key)
    if consumer_first:
        workspace.push_aside(ctx, a_shard, at)
    workspace.join(ctx)


def _run_baseline(
    ctx: AgGemmContext, a_shard: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Any
) -> None:
    """NCCL (gloo on CPU) all-gather, then one cuBLAS GEMM: what the op replaces. It
    gathers into an ordinary buffer of its own, not into the symmetric one: through that,
    on 2 H200s, it ran at 0.82x and 0.88x the same two calls made directly at 1024 and
    2048 x 4096 x 4096; through its own buffer at 1.00x (another machine). The gather
    touches neither G nor the flags, so the next call of any algorithm is safe. Its
    views of the buffer are made once per M, the gather skips torch's Python wrapper
    (:func:`kernels.ag_gemm_workspace.all_gather`): a call's host time is the two
    calls' own."""
    g = _baseline_rows(ctx, a_shard.shape[0])
    workspace.all_gather(ctx, g, a_shard)
    torch.mm(g, b, out=out)


def baseline_buffer(ctx: AgGemmContext) -> torch.Tensor:
    """The NCCL baseline's gathered buffer ``[max_M, K]``, made at its first use (a
    serving op makes it when it prepares the baseline, off the request path)."""
    if ctx.gathered is None:
        ctx.gathered = torch.empty(ctx.max_m, ctx.k, dtype=ctx.dtype, device=ctx.device)
    return ctx.gathered


def _baseline_rows(ctx: AgGemmContext, m_per_rank: int) -> torch.Tensor:
    """The baseline buffer's first ``m_per_rank * world`` rows: one view per M, made at
    its first call (a slice costs the host about a microsecond)."""
    key = ("gathered", m_per_rank)
    g = ctx.cache.get(key)
    if g is None:
        g = ctx.cache[key] = baseline_buffer(ctx)[: m_per_rank * ctx.world]
    return g  # type: ignore[no-any-return]


def _run_gather_first(
    ctx: AgGemmContext, a_shard: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Any
) -> None:
    """Barrier, this rank's rows pushed to every peer on this stream, a wait for every
    peer's, then one cuBLAS GEMM: at small M the GEMM reads all of B whatever the rows,
    so one GEMM after a low-latency gather beats splitting it."""
    m_per_rank = a_shard.shape[0]
    at = workspace.arm_and_meet(ctx, a_shard)
    workspace.push(ctx, a_shard, at)
    _await_rows(ctx, 0, at.g.shape[0] - 1, m_per_rank)
    torch.matmul(at.g, b, out=out)


def _run_overlap(
    ctx: AgGemmContext, a_shard: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Any
) -> None:
    """The own rows' GEMM at once; each peer's rows multiplied as soon as they land:
    cuBLAS speed, the gather hidden behind the GEMMs."""
    m_per_rank = a_shard.shape[0]
    at = workspace.arm_and_meet(ctx, a_shard)
    workspace.push_aside(ctx, a_shard, at)
    own = slice(ctx.rank * m_per_rank, (ctx.rank + 1) * m_per_rank)
    with _settled_on_error(ctx, at):
        torch.matmul(at.g[own], b, out=out[own])
    for src in workspace.peers_in_order(ctx):
        rows = slice(src * m_per_rank, (src + 1) * m_per_rank)
        _await_rows(ctx, rows.start, rows.stop - 1, m_per_rank)
        torch.matmul(at.g[rows], b, out=out[rows])
    workspace.join(ctx)


_RUNS = {
    FUSED: _run_fused,
    BASELINE: _run_baseline,
    GATHER_FIRST: _run_gather_first,
    OVERLAP: _run_overlap,
}


def run_for(config: KernelConfig) -> Callable[..., None]:
    """The run of ``config``'s algorithm; ValueError when this version has none of it."""
    run = _RUNS.get(algorithm_of(config))
    if run is None:
        raise ValueError(
            f"ag_gemm: config {config.label()} names algorithm {config.algorithm!r}; "
            f"this version runs {', '.join(ALGORITHMS)}."
        )
    return run


def _await_rows(ctx: AgGemmContext, row_lo: int, row_hi: int, m_per_rank: int) -> None:
    """The current stream waits until the peers' shards in rows [row_lo, row_hi] landed:
    one program of :func:`_wait_kernel` (a library GEMM cannot wait on a flag itself).
    Its one variant is compiled once per context (:func:`prepare_wait`)."""
    plan = _wait_plan(ctx, row_lo, row_hi, m_per_rank)
    if ctx.device.type != "cuda":
        plan.launch()
        return
    prepare_wait(ctx)
    plan.launch_compiled(ctx.cache["wait"])


def _wait_plan(ctx: AgGemmContext, row_lo: int, row_hi: int, m_per_rank: int) -> LaunchPlan:
    args = (ctx.flags, row_lo, row_hi, m_per_rank, ctx.rank)  # every integer unspecialised
    return LaunchPlan(_wait_kernel, (1,), args, {"WORLD": ctx.world, "num_warps": 1})


def prepare_wait(ctx: AgGemmContext) -> None:
    """Compile (or load) the wait kernel of the library algorithms that gather through
    the workspace, and keep it, so that no call compiles it."""
    if ctx.device.type == "cuda" and "wait" not in ctx.cache:
        plan = _wait_plan(ctx, 0, ctx.max_m - 1, max(1, ctx.max_m // ctx.world))
        compiled = plan.compile()
        getattr(compiled, "_init_handles", lambda: None)()  # load the module now
        ctx.cache["wait"] = compiled


@contextlib.contextmanager
def _settled_on_error(
    ctx: AgGemmContext, at: workspace.Rows, unpushed: torch.Tensor | None = None
) -> Iterator[None]:
    """Past the barrier the peers push into this rank whatever happens here, and wait
    for this rank's rows: if a launch fails (a config that does not compile, say), push
    this rank's rows (``unpushed``: not pushed yet), wait for every peer's rows and join
    before raising, so that no peer waits forever and no push of this call lands after
    the next call's arm."""
    try:
        yield
    except BaseException:
        if unpushed is not None:
            workspace.push_aside(ctx, unpushed, at)
        m_per_rank = at.own.shape[0]
        _await_rows(ctx, 0, at.g.shape[0] - 1, m_per_rank)
        workspace.join(ctx)
        raise


def _compiled(ctx: AgGemmContext, plan: LaunchPlan) -> Any:
    variant = plan.variant()
    compiled = ctx.cache.get(variant)
    if compiled is None:
        compiled = ctx.cache[variant] = plan.compile()
    return compiled


@dataclass(eq=False)  # its rows fill in as Ms are called: identity, not value
class _Prepared:
    """A fused launch at one (config, operand layout), made once and run at every M: the
    compiled kernel (no M-derived argument is specialised, so one variant serves them
    all), the arguments after the three operands (``g``, ``b``, ``out``: the first three
    of both consumers) as made for the first M, with the positions of M and of the rows
    per rank in them, each operand's TMA block (None: the tensor itself), whether the
    grid is persistent, and per M what a call at it launches with (:class:`_AtRows`,
    made at that M's first call from these, with no launch plan)."""

    compiled: Any
    tail: tuple[Any, ...]
    m_at: tuple[int, int]  # the tail's positions of M and of the rows per rank
    blocks: tuple[list[int] | None, ...]
    persistent: bool
    owns_g: bool  # g is the workspace's rows (a view per M), not the caller's shard
    rows: dict[tuple[int, int], _AtRows] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: AgGemmContext, plan: LaunchPlan, g: torch.Tensor) -> _Prepared:
        """From the launch plan of the first M called, over ``g``."""
        names = plan.kernel.arg_names[3:]  # the tail's, in signature order
        blocks = tuple(getattr(arg, "block_shape", None) for arg in plan.args[:3])
        return cls(
            compiled=_compiled(ctx, plan),
            tail=plan.full_args()[3:],
            m_at=(names.index("M"), names.index("m_per_rank")),
            blocks=blocks,
            persistent=blocks[0] is not None,
            owns_g=g.data_ptr() == ctx.buffer.data_ptr(),
        )

    def at_rows(
        self, ctx: AgGemmContext, g: torch.Tensor, n: int, m_per_rank: int, config: KernelConfig
    ) -> _AtRows:
        m = g.shape[0]
        tail = list(self.tail)
        tail[self.m_at[0]], tail[self.m_at[1]] = m, m_per_rank
        grid = (*_fused_grid(ctx, m, n, config, persistent=self.persistent), 1, 1)[:3]
        if not self.owns_g:
            return _AtRows(grid, tuple(tail), None, None)
        return _AtRows(grid, tuple(tail), g, _operand(g, self.blocks[0]))


@dataclass(frozen=True)
class _AtRows:
    """A fused launch's grid and arguments at one M; the workspace's ``g`` view at that M
    and its operand (None: ``g`` is the caller's, its descriptor made each call)."""

    grid: tuple[int, ...]
    tail: tuple[Any, ...]
    g: torch.Tensor | None
    g_operand: Any


def _fused_key(
    ctx: AgGemmContext, config: KernelConfig, g: torch.Tensor, b: torch.Tensor, out: torch.Tensor
) -> tuple[Any, ...] | None:
    """Where :func:`_launch_fused` keeps its :class:`_Prepared` (None off CUDA)."""
    if ctx.device.type != "cuda":
        return None
    return ("fused", config, _layout(g), _layout(b), _layout(out))


def _launch_fused(
    ctx: AgGemmContext,
    g: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    m_per_rank: int,
    config: KernelConfig,
    key: tuple[Any, ...] | None = None,
) -> None:
    """The consumer over ``g`` (the workspace's rows; one rank: the shard): on CUDA
    through what :class:`_Prepared` keeps, so a steady call makes the descriptors of
    ``b`` and ``out`` and launches, and the first call at an M adds only its grid and
    arguments, never a launch plan (docs/benchmarks/serving.md: first calls at a new M)."""
    if ctx.device.type != "cuda":
        launch_plan(ctx, g, b, out, m_per_rank, config).launch()
        return
    key = key or _fused_key(ctx, config, g, b, out)
    prepared = ctx.cache.get(key)
    if prepared is None:
        plan = launch_plan(ctx, g, b, out, m_per_rank, config)
        prepared = ctx.cache[key] = _Prepared.of(ctx, plan, g)
    at = prepared.rows.get((g.shape[0], m_per_rank))
    if at is None or (at.g is not None and at.g is not g):
        at = prepared.at_rows(ctx, g, b.shape[1], m_per_rank, config)
        prepared.rows[(g.shape[0], m_per_rank)] = at
    g_operand = at.g_operand if at.g is not None else _operand(g, prepared.blocks[0])
    b_operand, out_operand = _operand(b, prepared.blocks[1]), _operand(out, prepared.blocks[2])
    prepared.compiled[at.grid](g_operand, b_operand, out_operand, *at.tail)


def _layout(t: torch.Tensor) -> tuple[bool, int, int]:
    """What of an operand a compiled variant and the choice of consumer depend on."""
    return t.data_ptr() % 16 == 0, t.shape[1], t.stride(0)


def _operand(t: torch.Tensor, block: list[int] | None) -> Any:
    if block is None:
        return t
    return TensorDescriptor.from_tensor(t, block)


# The TMA consumer's own meta-parameters, and what a config without them runs with; the
# portable consumer takes neither.
HOPPER_META: dict[str, int | bool] = {"EPILOGUE_SUBTILE": 1}


def launch_plan(
    ctx: AgGemmContext,
    g: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    m_per_rank: int,
    config: KernelConfig,
) -> LaunchPlan:
    """What :func:`ag_gemm` launches for gathered ``g: [M, K]``, ``b: [K, N]``; nothing
    here may depend on M beyond the grid and the unspecialised integers."""
    (m, k), n = g.shape, b.shape[1]
    options = {**config.all_kwargs(), "WORLD": ctx.world}
    hopper_only = {name: options.pop(name, default) for name, default in HOPPER_META.items()}
    if ctx.consumer == "tma" and _tma_aligned(g, b, out):
        bm, bn, bk = (meta_int(config, name) for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        # NUM_SMS is the loop stride, fixed per device; a smaller grid leaves no tile out.
        options |= {"NUM_SMS": ctx.limits.sm_count, **hopper_only}
        store_n = bn // meta_int(config, "EPILOGUE_SUBTILE", 1)
        descriptors = (_operand(g, [bm, bk]), _operand(b, [bk, bn]), _operand(out, [bm, store_n]))
        args: tuple[Any, ...] = (*descriptors, ctx.flags, m, n, k, m_per_rank, ctx.rank)
        grid = _fused_grid(ctx, m, n, config, persistent=True)
        return LaunchPlan(_ag_gemm_tma_kernel, grid, args, options)
    args = (g, b, out, ctx.flags, m, n, k, m_per_rank, ctx.rank)
    args += (g.stride(0), b.stride(0), out.stride(0))
    grid = _fused_grid(ctx, m, n, config, persistent=False)
    return LaunchPlan(_ag_gemm_portable_kernel, grid, args, options)


def _fused_grid(
    ctx: AgGemmContext, m: int, n: int, config: KernelConfig, *, persistent: bool
) -> tuple[int]:
    """One program per output tile; the TMA consumer is persistent: at most one per SM."""
    tiles = triton.cdiv(m, meta_int(config, "BLOCK_M")) * triton.cdiv(
        n, meta_int(config, "BLOCK_N")
    )
    return (min(ctx.limits.sm_count, tiles),) if persistent else (tiles,)


def _tma_aligned(*tensors: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides; odd K or N take the portable path."""
    return all(
        t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors
    )
