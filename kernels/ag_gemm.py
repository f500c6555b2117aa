"""Fused AllGather-GEMM for tensor parallelism: ``all_gather(a_shard) @ b`` on every rank.

Each rank holds ``a_shard: [M/world, K]`` and ``b: [K, N]`` (its column shard of a
weight). The gather hides behind the GEMM:

* A context (:mod:`kernels.ag_gemm_workspace`), made once per process group and maximum
  shape, owns the gathered buffer ``G: [max_M, K]`` and per-source ready flags, both
  writable by every peer, and a side stream.
* A call arms its flags, puts its own rows in G, meets the peers at a barrier; then the
  side stream pushes this rank's rows into every peer's G with the copy engine (no SMs),
  each followed by this rank's flag there. Nothing on the host changes from call to
  call, so calls repeat back to back and replay from a CUDA graph.
* The consumer GEMM walks its tiles starting at its own rows (ready at once) and makes
  every tile wait for the flags of the shards its rows come from.

Consumers: a persistent kernel with TMA tensor descriptors for Hopper (sm90+), and a
pointer-based kernel for other CUDA GPUs and for CPU under ``TRITON_INTERPRET=1``,
where memory-mapped files stand in for symmetric memory.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from kernels import ag_gemm_workspace as workspace
from kernels import cublas_heuristics
from kernels.adapter import LaunchPlan, Layer, dtype_name, gemm_flops, torch_dtype
from kernels.ag_gemm_workspace import (
    AgGemmContext,
    create_context,
    group_size_and_rank,
    input_buffer,
)
from kernels.spaces import Problem, ag_gemm_space, meta_int
from kernels.task import ProductTask
from registry import KernelConfig

NAME = "ag_gemm"
# Integers that change from call to call: specialised (divisible by 16, == 1) they would
# make a new kernel for most batch sizes, so no serving call could be warm.
M_DERIVED = ["M", "m_per_rank", "rank"]
__all__ = ["AgGemmContext", "create_context", "group_size_and_rank", "input_buffer"]


@triton.jit  # type: ignore[untyped-decorator]
def _wait_for_rows(flags_ptr, row_lo, row_hi, m_per_rank, rank, WORLD: tl.constexpr):
    """Spin until every shard holding rows [row_lo, row_hi] has landed (own rows excepted);
    a peer's copy engine raises the flag, hence the system scope."""
    first, last = row_lo // m_per_rank, row_hi // m_per_rank
    for src in tl.static_range(WORLD):
        if (src != rank) & (src >= first) & (src <= last):
            flag = tl.atomic_add(flags_ptr + src, 0, sem="acquire", scope="sys")
            while flag == 0:
                flag = tl.atomic_add(flags_ptr + src, 0, sem="acquire", scope="sys")


@triton.jit(do_not_specialize=["row_lo", "row_hi", "m_per_rank", "rank"])  # type: ignore[untyped-decorator]
def _wait_kernel(flags_ptr, row_lo, row_hi, m_per_rank, rank, WORLD: tl.constexpr):
    """One program: the wait of a tile, before a library GEMM reads those rows."""
    _wait_for_rows(flags_ptr, row_lo, row_hi, m_per_rank, rank, WORLD)


@triton.jit
def _fence_async_proxy(x):
    """Order the flag's acquire before the TMA (async proxy) reads of the data it guards."""
    return tl.inline_asm_elementwise(
        "fence.proxy.async.global; mov.b32 $0, $1;",
        "=r,r",
        [x],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _tile_coords(
    tile,
    M,
    N,
    m_per_rank,
    rank,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Grouped tile order over M-tiles rotated to start at this rank's first row."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (tile // in_group) * GROUP_M
    group_size = min(tiles_m - first_m, GROUP_M)
    rotated_m = first_m + (tile % in_group) % group_size
    pid_n = (tile % in_group) // group_size
    pid_m = (rotated_m + (rank * m_per_rank) // BLOCK_M) % tiles_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=M_DERIVED)  # type: ignore[untyped-decorator]
def _ag_gemm_portable_kernel(
    g_ptr,
    b_ptr,
    c_ptr,
    flags_ptr,
    M,
    N,
    K,
    m_per_rank,
    rank,
    stride_gm,
    stride_bk,
    stride_cm,
    WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # g: [M, K] gathered A (own rows local, peers' rows as their flags rise); b: [K, N]
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, m_per_rank, rank, BLOCK_M, BLOCK_N, GROUP_M)
    row_lo = pid_m * BLOCK_M
    _wait_for_rows(flags_ptr, row_lo, min(row_lo + BLOCK_M, M) - 1, m_per_rank, rank, WORLD)
    rows = row_lo + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(
            g_ptr + rows[:, None] * stride_gm + (k0 + ks)[None, :],
            mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k0 + ks)[:, None] * stride_bk + cols[None, :],
            mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(
        c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask
    )


@triton.jit(do_not_specialize=M_DERIVED)  # type: ignore[untyped-decorator]
def _ag_gemm_tma_kernel(
    g_desc,
    b_desc,
    c_desc,
    flags_ptr,
    M,
    N,
    K,
    m_per_rank,
    rank,
    WORLD: tl.constexpr,
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
):
    # Persistent: program p takes tiles p, p + NUM_SMS, ...; TMA loads, TMA store.
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_tiles, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, M, N, m_per_rank, rank, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        _wait_for_rows(flags_ptr, off_m, min(off_m + BLOCK_M, M) - 1, m_per_rank, rank, WORLD)
        _fence_async_proxy(M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = g_desc.load([off_m, kt * BLOCK_K])
            b = b_desc.load([kt * BLOCK_K, off_n])
            acc = tl.dot(a, b, acc)
        if EPILOGUE_SUBTILE == 2:  # two half-width stores: half the shared memory
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


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
FUSED = "fused_pull"  # copy-engine pushes overlapped with the Triton consumer above
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
    checks of its inputs and a dict lookup (docs/benchmarks.md: what a call costs).
    """
    m, n, _ = check_inputs(a_shard, b, ctx, out)
    run = _RUNS.get(algorithm_of(config)) or _run_for(config)
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


def _baseline_buffer(ctx: AgGemmContext) -> torch.Tensor:
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
        g = ctx.cache[key] = _baseline_buffer(ctx)[: m_per_rank * ctx.world]
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


def _run_for(config: KernelConfig) -> Callable[..., None]:
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
    arguments, never a launch plan (docs/benchmarks.md: first calls at a new M)."""
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
    from triton.tools.tensor_descriptor import TensorDescriptor

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


@dataclass
class AgGemmTask(ProductTask):
    """One AllGather-GEMM problem, as the tuner sees it (:class:`kernels.task.TuneTask`):
    ``a`` is this rank's shard of the rows. Every rank builds the same task; the tuner
    runs them in lockstep. Its reference gathers: a collective, made with the inputs."""

    a: torch.Tensor
    b: torch.Tensor
    ctx: AgGemmContext
    configs: list[KernelConfig] | None = None  # default: the pruned, model-ordered space
    # makes (a, b) again after drop_inputs(); None: the caller's inputs, never dropped
    inputs: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    kernel: str = NAME
    out: torch.Tensor | None = None
    _expected: torch.Tensor | None = None
    collective_reference = True

    def __post_init__(self) -> None:
        self._expected = self.reference()

    def reference(self) -> torch.Tensor:
        """NCCL + cuBLAS in the input dtype on GPUs (cheap on the start-up path); float64
        on the CPU."""
        if self.a.device.type == "cpu":
            return reference(self.a.double(), self.b.double(), self.ctx.group)
        return reference(self.a, self.b, self.ctx.group)

    @property
    def kernel_hash(self) -> str:
        return kernel_hash()

    def key(self) -> dict[str, Any]:
        return key(self.a, self.b, self.ctx)

    def candidates(self) -> list[KernelConfig]:
        """The baseline first (the policy 'fallback' takes the first), the other library
        algorithms, then the fused space, pruned and ordered by the model."""
        if self.configs is not None:
            return list(self.configs)
        return candidates(self.ctx, problem(self.a, self.b, self.ctx))

    def baseline(self) -> KernelConfig:
        """NCCL + cuBLAS: the tuner stores another algorithm only if it beats this one
        beyond noise."""
        return BASELINE_CONFIG

    def run(self, config: KernelConfig) -> torch.Tensor:
        if self.out is None:
            m, n = self.a.shape[0] * self.ctx.world, self.b.shape[1]
            self.out = torch.empty(m, n, dtype=self.ctx.dtype, device=self.ctx.device)
        return ag_gemm(self.a, self.b, self.ctx, config, out=self.out)

    def warmup(self, config: KernelConfig) -> None:
        if self.ctx.device.type != "cuda" or algorithm_of(config) == BASELINE:
            return  # the interpreter compiles nothing; the baseline compiles nothing
        if algorithm_of(config) != FUSED:
            prepare_wait(self.ctx)
            return
        m, n, _ = check_inputs(self.a, self.b, self.ctx)
        g = self.a if self.ctx.world == 1 else self.ctx.buffer[:m]
        out = (
            torch.empty(m, n, dtype=self.ctx.dtype, device=self.ctx.device)
            if self.out is None
            else self.out
        )
        launch_plan(self.ctx, g, self.b, out, self.a.shape[0], config).compile()


def key(a_shard: torch.Tensor, b: torch.Tensor, ctx: AgGemmContext) -> dict[str, Any]:
    """What a tuned config depends on: gathered M, per-rank N, K, dtype, ranks."""
    return {
        "M": a_shard.shape[0] * ctx.world,
        "N": b.shape[1],
        "K": a_shard.shape[1],
        "dtype": dtype_name(a_shard.dtype),
        "world": ctx.world,
    }


def problem(a_shard: torch.Tensor, b: torch.Tensor, ctx: AgGemmContext) -> Problem:
    return Problem(
        m=a_shard.shape[0] * ctx.world,
        n=b.shape[1],
        k=a_shard.shape[1],
        world=ctx.world,
        element_bytes=a_shard.element_size(),
    )


def space(ctx: AgGemmContext) -> list[KernelConfig]:
    """The fused algorithm's config space for the context's device (see
    :mod:`kernels.spaces`); the library algorithms have no parameters."""
    return [replace(c, algorithm=FUSED) for c in ag_gemm_space(ctx.limits)]


def library_configs(ctx: AgGemmContext) -> list[KernelConfig]:
    """One config per library algorithm; on one rank there is nothing to gather, and the
    baseline alone (a plain GEMM) stands for them."""
    names = LIBRARY if ctx.world > 1 else (BASELINE,)
    return [KernelConfig.make(algorithm=name) for name in names]


def candidates(ctx: AgGemmContext, problem_: Problem) -> list[KernelConfig]:
    """Every algorithm's configs for one problem: the library ones (the baseline first),
    then the fused space, pruned and ordered by the performance model."""
    from kernels.spaces import ordered, prune

    fused = prune(space(ctx), problem_, ctx.limits).kept
    return library_configs(ctx) + ordered(fused, problem_, ctx.limits)


def reference(a_shard: torch.Tensor, b: torch.Tensor, group: Any = None) -> torch.Tensor:
    """NCCL (or gloo) ``all_gather_into_tensor`` then ``torch.matmul`` (cuBLAS on GPU)."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return torch.matmul(a_shard, b)
    gathered = a_shard.new_empty(a_shard.shape[0] * world, a_shard.shape[1])
    ALL_GATHER(gathered, a_shard, group=group)
    return torch.matmul(gathered, b)


def torch_fused(a_shard: torch.Tensor, b: torch.Tensor, group: Any) -> torch.Tensor | None:
    """torch's ``symm_mem.fused_all_gather_matmul`` where this torch has it, else None."""
    op = getattr(getattr(torch.ops, "symm_mem", None), "fused_all_gather_matmul", None)
    if op is None or a_shard.device.type != "cuda":
        return None
    _, outputs = op(a_shard, [b], gather_dim=0, group_name=group.group_name)
    return outputs[0]  # type: ignore[no-any-return]


def kernel_hash() -> str:
    """The public hash of both consumers' sources and of the algorithms a config may
    choose (part of every fingerprint): a version that adds an algorithm tunes again
    rather than keep a winner chosen without it."""
    import hashlib

    from registry import kernel_source_hash

    tma = kernel_source_hash(_ag_gemm_tma_kernel)
    algorithms = hashlib.sha256(",".join(ALGORITHMS).encode()).hexdigest()[:8]
    return f"{tma}{kernel_source_hash(_ag_gemm_portable_kernel)[:16]}-{algorithms}"


class AgGemmServed:
    """One tensor-parallel layer, served: a context for (group, K, dtype, max M), calls
    with any config. See :class:`kernels.adapter.Served`."""

    kernel = NAME

    def __init__(self, layer: Layer, *, group: Any, device: Any) -> None:
        self.layer = layer
        self.ctx = create_context(
            group, max_m=layer.max_m, k=layer.k, dtype=torch_dtype(layer.dtype), device=device
        )
        self.rows_step, self.device = self.ctx.world, self.ctx.device
        self.collective = self.ctx.world > 1  # ranks must change algorithms together
        self._chosen: dict[bool, set[int]] = {False: set(), True: set()}  # cuBLAS shapes run

    @property
    def group(self) -> Any:
        return self.ctx.group

    def key(self, m: int) -> dict[str, Any]:
        return ADAPTER.key(
            m=m, n=self.layer.n, k=self.layer.k, dtype=self.layer.dtype, world=self.ctx.world
        )

    def rows(self, a_shard: torch.Tensor, b: torch.Tensor) -> int:
        return int(a_shard.shape[0]) * self.rows_step

    def __call__(
        self, config: KernelConfig, a_shard: torch.Tensor, b: torch.Tensor, out: Any = None
    ) -> torch.Tensor:
        if b.shape[-1] != self.layer.n:  # K, dtype and device: checked by ag_gemm
            raise ValueError(
                f"ag_gemm: b is {list(b.shape)}; this layer's is [{self.layer.k}, {self.layer.n}]."
            )
        return ag_gemm(a_shard, b, self.ctx, config, out=out)

    def agree(self, value: Any) -> Any:
        return workspace.agree(self.ctx, value)

    def all_true(self, flag: bool) -> bool:
        if self.ctx.world == 1:
            return flag
        device = self.ctx.device if dist.get_backend(self.ctx.group) == "nccl" else "cpu"
        votes = torch.tensor([int(flag)], dtype=torch.int32, device=device)
        dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=self.ctx.group)
        return bool(votes.item())

    def prepare(self, config: KernelConfig, rows: Sequence[int]) -> None:
        """The fused variant compiled or loaded once (one serves every M); for a library
        algorithm, one cuBLAS call at each shape its calls of ``rows`` will make: cuBLAS
        chooses and loads a kernel at the first call of each shape (0.2 ms at the median
        and 3.4 ms at p90 on an H200 at N 7168, K 4096, against 18 us after), which no
        request may pay."""
        _run_for(config)  # an algorithm this version lacks fails here, not on a request
        if algorithm_of(config) == BASELINE and self.ctx.world > 1:
            _baseline_buffer(self.ctx)
        if self.ctx.device.type != "cuda":
            return  # the interpreter compiles nothing
        if algorithm_of(config) != FUSED:
            self._choose_gemms(config, rows)
            if algorithm_of(config) != BASELINE and self.ctx.world > 1:
                prepare_wait(self.ctx)
        else:
            self.warm_up_plan(config).load()

    def _choose_gemms(self, config: KernelConfig, rows: Sequence[int]) -> None:
        """One GEMM per new shape of ``config``'s calls at ``rows``, on scratch memory and
        a stream of its own (off any request's way), waited for."""
        world = self.ctx.world
        per_shard = algorithm_of(config) == OVERLAP and world > 1  # one GEMM per shard
        shapes = sorted({m // world if per_shard else m for m in rows} - self._chosen[per_shard])
        if not shapes:
            return
        ctx, n = self.ctx, self.layer.n
        # a shard's GEMM also runs at an offset: both alignments
        gemms = [(m, at) for m in shapes for at in ((0, m) if per_shard else (0,))]
        cublas_heuristics.PROCESS.make_room(
            ((m, n, ctx.k, ctx.dtype, at > 0) for m, at in gemms),
            load=lambda: torch.ones(1, 1, dtype=ctx.dtype, device=ctx.device).mm(
                torch.ones(1, 1, dtype=ctx.dtype, device=ctx.device)
            ),
        )
        stream = torch.cuda.Stream(device=ctx.device)  # type: ignore[no-untyped-call]
        rows_needed = shapes[-1] * (2 if per_shard else 1)
        with torch.cuda.stream(stream):
            a = torch.zeros(rows_needed, ctx.k, dtype=ctx.dtype, device=ctx.device)
            b = torch.zeros(ctx.k, n, dtype=ctx.dtype, device=ctx.device)
            out = torch.empty(rows_needed, n, dtype=ctx.dtype, device=ctx.device)
            for m, at in gemms:
                torch.matmul(a[at : at + m], b, out=out[at : at + m])
        stream.synchronize()
        self._chosen[per_shard].update(shapes)

    def warm_up_plan(self, config: KernelConfig) -> LaunchPlan:
        """A launch plan on meta tensors: the specialisation of an aligned real call, no
        memory, nothing launched."""
        world, n, k, dtype = self.ctx.world, self.layer.n, self.layer.k, self.ctx.dtype
        g, b, out = (
            torch.empty(*shape, dtype=dtype, device="meta")
            for shape in ((world, k), (k, n), (world, n))
        )
        return launch_plan(self.ctx, g, b, out, 1, config)

    def rehearse(self, configs: Sequence[KernelConfig]) -> None:
        ctx, layer = self.ctx, self.layer
        shard = torch.randn(1, layer.k, dtype=ctx.dtype, device=ctx.device)
        b = torch.randn(layer.k, layer.n, dtype=ctx.dtype, device=ctx.device)  # freed on return
        for config in configs:
            ag_gemm(shard, b, ctx, config)
        if ctx.device.type == "cuda":
            torch.cuda.current_stream(ctx.device).synchronize()

    def default_config(self) -> KernelConfig:
        """The baseline: with no tuning to go by, never slower than what it replaces."""
        return BASELINE_CONFIG


class AgGemmAdapter:
    """The fused AllGather-GEMM, as ``warmup/`` drives it (:class:`kernels.adapter.Adapter`)."""

    name = NAME

    def kernel_hash(self) -> str:
        return kernel_hash()

    def check_shape(self, shape: Mapping[str, int], *, world_size: int) -> str | None:
        if shape["M"] % world_size:
            return f"M={shape['M']} is not a multiple of world_size {world_size}"
        return None

    def key(self, *, m: int, n: int, k: int, dtype: str, world: int) -> dict[str, Any]:
        return {"M": m, "N": n, "K": k, "dtype": dtype, "world": world}

    def tasks(
        self, shapes: Sequence[Mapping[str, int]], *, dtype: str, group: Any, device: Any
    ) -> Iterator[AgGemmTask]:
        """Random inputs per shape; one workspace per K, sized for that K's largest M."""
        contexts: dict[int, AgGemmContext] = {}
        for shape in shapes:
            m, n, k = shape["M"], shape["N"], shape["K"]
            if k not in contexts:  # made in the same order on every rank: a collective
                max_m = max(s["M"] for s in shapes if s["K"] == k)
                contexts[k] = create_context(
                    group, max_m=max_m, k=k, dtype=torch_dtype(dtype), device=device
                )
            inputs = functools.partial(_random_inputs, m, n, k, contexts[k])
            yield AgGemmTask(*inputs(), contexts[k], inputs=inputs)

    def tuning_cost(self, shape: Mapping[str, int]) -> float:
        return gemm_flops(shape)

    def serve(self, layer: Layer, *, group: Any, device: Any) -> AgGemmServed:
        return AgGemmServed(layer, group=group, device=device)


def _random_inputs(m: int, n: int, k: int, ctx: AgGemmContext) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard and B for one shape: the same every time they are made."""
    generator = torch.Generator(device=ctx.device).manual_seed(m * 31 + n * 7 + k + ctx.rank)
    shard = torch.randn(m // ctx.world, k, generator=generator, device=ctx.device, dtype=ctx.dtype)
    b = torch.randn(k, n, generator=generator, device=ctx.device, dtype=ctx.dtype) / k**0.5
    return shard, b


ADAPTER = AgGemmAdapter()
