"""The AllGather-GEMM's workspace and the protocol that fills it (see :mod:`kernels.ag_gemm`).

Every rank owns ``G: [max_M, K]`` and ``flags: int32 [world]``, both writable by its
peers: symmetric memory on CUDA, memory-mapped shared files on the CPU. One call, the
same steps on every rank:

1. **arm**: ``flags[:] = 0`` (this rank's own consumers of the last call are done with
   them: stream order).
2. **meet**: a barrier. Past it, every peer is past its previous call too: its
   consumers are done reading its G and flags, and its flags are armed.
3. **own rows**: ``G[own] = a_shard``, unless the producer wrote it there
   (:func:`input_buffer`); only this rank reads them, so it need not precede the
   barrier, and the pushes do not wait for it.
4. **push** (side stream): for each peer, the one that reads these rows first first,
   ``G_peer[own] = a_shard``, then ``flags_peer[rank] = 1``, both copies on one stream
   (the second starts when the first has landed).
5. **consume**: a reader waits for ``flags[src] != 0`` before it reads ``src``'s rows.
6. **join**: the caller's stream waits for the side stream.

No host state changes from call to call and every value written is a constant, so a
call captured in a CUDA graph replays correctly any number of times, between eager
calls or other graphs: the barrier orders each call after the last one everywhere.

**Layers sharing one workspace** (a serving process's layers of one group, made with
``shared=True``: :mod:`kernels.ag_gemm_memory`) view the same bytes as their own
``[max_M, K]`` and use the same flags, barrier and side stream. Nothing above names a
layer: a call is the same six steps over the same memory, so the barrier of call n+1
orders it after call n of *any* layer, on every rank, given that every rank calls the
sharing layers in the same order (their calls are collectives anyway) and that call n+1
is ordered after call n on this rank (one stream, or the caller orders its streams).
Then no write of call n lands after call n+1 began: this rank's pushes of call n are
joined before its barrier n+1 (step 6); a peer's pushes into this rank's bytes landed
before this rank's consumer of call n ended, which waited for every peer's flag (every
algorithm that reads the workspace reads every shard); and a peer writes nothing of
call n+1 here before it passed barrier n+1, which waits for this rank's arrival, after
its producer wrote its own rows into :func:`input_buffer` (its own bytes only). A graph
that captured calls of several layers replays them in their captured order, which is
the same on every rank. Two streams calling sharing layers without ordering them, each
its own sequence, would break this: such layers take a workspace of their own
(``create_context(shared=False)``, the default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from kernels import ag_gemm_memory
from kernels.adapter import DTYPES, dtype_name, indexed_device
from kernels.ag_gemm_memory import Workspace
from kernels.spaces import DeviceLimits, device_limits


@dataclass
class AgGemmContext:
    """Buffers, flags and streams for one process group and maximum shape; reused by
    every call. Make it with :func:`create_context` on every rank of the group."""

    group: Any
    rank: int
    world: int
    max_m: int
    k: int
    dtype: torch.dtype
    device: torch.device
    limits: DeviceLimits
    buffer: torch.Tensor  # G: [max_M, K], this rank's, peers write their rows into it
    flags: torch.Tensor  # int32 [world]: flags[src] != 0 once src's rows of this call landed
    one: torch.Tensor  # int32 [1] == 1: what a signal writes
    consumer: str = "portable"  # "tma" (Hopper, persistent) or "portable"
    peer_buffers: list[torch.Tensor] = field(default_factory=list)  # [dst]: dst's G, mapped
    peer_flags: list[torch.Tensor] = field(default_factory=list)  # [dst]: dst's flags, mapped
    space: Workspace | None = None  # the memory G and the flags are views of (world > 1)
    handle: Any = None  # CUDA: G's symmetric-memory handle (its barrier)
    side_stream: Any = None
    forked: Any = None  # CUDA events: the side stream starts at the barrier ...
    joined: Any = None  # ... and the caller's stream waits for its end
    caller: Any = None  # the calling stream of the call under way (CUDA), set at its arm
    gathered: torch.Tensor | None = None  # [max_M, K]: the NCCL baseline's, on first use
    gather: Any = None  # the group's own all-gather method and its options: see all_gather
    calls: int = 0  # calls made through this context, on this rank (host-side count)
    cache: dict[Any, Any] = field(default_factory=dict)  # per-shape launch state (ag_gemm's)
    device_index: int = field(init=False)  # what Tensor.get_device() says on the device

    def __post_init__(self) -> None:
        self.device_index = self.device.index if self.device.type == "cuda" else -1


def group_size_and_rank(group: Any) -> tuple[int, int]:
    """(world, rank) of ``group``; one process without torch.distributed is (1, 0)."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _named(group: Any) -> Any:
    """``group``, or the default group for None once torch.distributed is initialized
    (symmetric memory rendezvous by the group's name)."""
    if group is None and dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return group


def create_context(
    group: Any,
    *,
    max_m: int,
    k: int,
    dtype: torch.dtype,
    device: torch.device | str,
    consumer: str | None = None,
    shared: bool = False,
) -> AgGemmContext:
    """A context for gathered A up to ``[max_m, k]`` (a collective).

    ``consumer``: ``"tma"`` or ``"portable"``; by default TMA on Hopper and newer.
    ``shared``: view the process's workspace of this group and device
    (:func:`kernels.ag_gemm_memory.shared`: no allocation, no rendezvous once one holds
    the rows), rather than allocate one of its own; every context sharing it must be
    called in one order on every rank (see the protocol above).
    """
    device = indexed_device(device)
    group = _named(group)
    world, rank = group_size_and_rank(group)
    _check_shape(max_m, k, dtype, world)
    limits = device_limits(device)
    consumer = _consumer(consumer, device, limits)
    ctx = AgGemmContext(
        group=group,
        rank=rank,
        world=world,
        max_m=max_m,
        k=k,
        dtype=dtype,
        device=device,
        limits=limits,
        buffer=torch.empty(0, k, dtype=dtype, device=device),
        flags=torch.zeros(world, dtype=torch.int32, device=device),
        one=torch.ones(1, dtype=torch.int32, device=device),
        consumer=consumer,
    )
    if world > 1:
        make = ag_gemm_memory.shared if shared else ag_gemm_memory.allocate
        nbytes = max_m * k * dtype.itemsize
        _use(ctx, make(group, world=world, rank=rank, device=device, nbytes=nbytes))
        ctx.gather = _gather_method(group)
    return ctx


def reserve_workspace(group: Any, *, nbytes: int, device: torch.device | str) -> None:
    """The process's workspace of ``group`` on ``device`` made to hold ``nbytes`` of
    rows, unless it does (:func:`kernels.ag_gemm_memory.shared`; a collective then)."""
    group = _named(group)
    world, rank = group_size_and_rank(group)
    if world > 1:
        device = indexed_device(device)
        ag_gemm_memory.shared(group, world=world, rank=rank, device=device, nbytes=nbytes)


def _use(ctx: AgGemmContext, space: Workspace) -> None:
    """``ctx``'s G, flags, handle and streams: views and parts of ``space``."""
    ctx.space = space
    ctx.buffer, ctx.peer_buffers = space.rows(ctx.max_m, ctx.k, ctx.dtype)
    ctx.flags, ctx.peer_flags = space.flags, space.peer_flags
    ctx.handle, ctx.side_stream = space.handle, space.side_stream
    ctx.forked, ctx.joined = space.forked, space.joined


def _gather_method(group: Any) -> tuple[Any, Any]:
    """The process group's all-gather into one tensor (``all_gather_single``, named
    ``_allgather_base`` before torch 2.13) and options for a call that the caller's
    stream waits for, as ``dist.all_gather_into_tensor`` passes them."""
    from torch._C._distributed_c10d import AllgatherOptions  # only in torch built with distributed

    options = AllgatherOptions()
    if hasattr(options, "asyncOp"):  # False: NCCL runs it on the caller's stream
        options.asyncOp = False
    return getattr(group, "all_gather_single", None) or group._allgather_base, options


def all_gather(ctx: AgGemmContext, out: torch.Tensor, a_shard: torch.Tensor) -> None:
    """NCCL's (gloo's) all-gather of every rank's ``a_shard`` into ``out`` ``[M, K]``,
    ordered on the caller's stream: what ``dist.all_gather_into_tensor`` does, through
    the group's method without the Python wrapper around it, whose checks (of things
    this module already checked: dense, real, a member of the group) and warnings cost
    a call 6 to 10 us of host time (torch 2.13, one CPU core). A collective."""
    method, options = ctx.gather
    work = method(out, a_shard, options)
    if work is not None:
        work.wait()


def _check_shape(max_m: int, k: int, dtype: torch.dtype, world: int) -> None:
    """ValueError unless ``max_m`` is a positive multiple of ``world``, ``k`` is positive
    and ``dtype`` is one the kernel supports."""
    if max_m <= 0 or k <= 0 or max_m % world:
        raise ValueError(
            f"ag_gemm context: max_m={max_m} must be a positive multiple of the "
            f"world size {world}, and k={k} positive."
        )
    if dtype_name(dtype) is None:
        raise ValueError(
            f"ag_gemm context: dtype {dtype} not supported; use one of {sorted(DTYPES)}."
        )


def _consumer(consumer: str | None, device: torch.device, limits: DeviceLimits) -> str:
    """The consumer asked for, or TMA on a Hopper or newer GPU and portable elsewhere;
    ValueError for one that cannot run on ``device``."""
    consumer = consumer or ("tma" if device.type == "cuda" and limits.is_hopper else "portable")
    if consumer not in ("tma", "portable") or (
        consumer == "tma" and not (device.type == "cuda" and limits.is_hopper)
    ):
        raise ValueError(
            f"ag_gemm context: consumer {consumer!r} not available on {limits.name}; "
            "use 'portable'."
        )
    return consumer


def input_buffer(ctx: AgGemmContext, m_per_rank: int) -> torch.Tensor:
    """Where the next call reads this rank's shard: a producer that writes its output
    here (on the stream that then calls ag_gemm) saves the call a copy of the shard.

    a_shard: [m_per_rank, K]. Any other tensor still works; it is copied in.
    """
    if m_per_rank <= 0 or m_per_rank * ctx.world > ctx.max_m:
        raise ValueError(
            f"ag_gemm: {m_per_rank} rows per rank exceed the context's "
            f"max_m {ctx.max_m} over {ctx.world} ranks."
        )
    if ctx.world == 1:
        return torch.empty(m_per_rank, ctx.k, dtype=ctx.dtype, device=ctx.device)
    return ctx.buffer[ctx.rank * m_per_rank : (ctx.rank + 1) * m_per_rank]


def peers_in_order(ctx: AgGemmContext) -> list[int]:
    """The peers, starting after this rank: the order every consumer reads their rows."""
    return [(ctx.rank + step) % ctx.world for step in range(1, ctx.world)]


def readers_in_order(ctx: AgGemmContext) -> list[int]:
    """The peers this rank pushes to, the one that reads its rows soonest first (rank
    r - 1 reads ours right after its own)."""
    return [(ctx.rank - step) % ctx.world for step in range(1, ctx.world)]


@dataclass(frozen=True)
class Rows:
    """The views of one call at ``m_per_rank`` rows per rank, made once per M: slicing
    costs the host a microsecond a view, and a descriptor made for ``g`` stays valid
    while ``g`` is this same view."""

    g: torch.Tensor  # G[:M]
    own: torch.Tensor  # this rank's rows in G
    pushes: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per reader: its rows, its flag


def rows(ctx: AgGemmContext, m_per_rank: int) -> Rows:
    key = ("rows", m_per_rank)
    made = ctx.cache.get(key)
    if made is None:
        g = ctx.buffer[: m_per_rank * ctx.world]
        ours = slice(ctx.rank * m_per_rank, (ctx.rank + 1) * m_per_rank)
        pushes = tuple(
            (ctx.peer_buffers[dst][ours], ctx.peer_flags[dst][ctx.rank : ctx.rank + 1])
            for dst in readers_in_order(ctx)
        )
        made = ctx.cache[key] = Rows(g, g[ours], pushes)
    return made  # type: ignore[no-any-return]


def arm_and_meet(ctx: AgGemmContext, a_shard: torch.Tensor) -> Rows:
    """Steps 1 to 3 on the caller's stream: flags armed, the barrier, own rows in G.
    The side stream (CUDA) starts at the barrier, not after whatever the caller launches
    next (a consumer that waits for the peers' pushes: theirs wait the same way)."""
    at = rows(ctx, a_shard.shape[0])
    ctx.flags.zero_()
    if ctx.device.type == "cuda":
        ctx.caller = caller_stream(ctx)  # looked up once a call: push_aside and join use it
        ctx.handle.barrier(channel=0)
        ctx.forked.record(ctx.caller)  # where push_aside's side stream starts
    else:
        dist.barrier(group=ctx.group)
    if at.own.data_ptr() != a_shard.data_ptr():  # read here only: off the pushes' path
        at.own.copy_(a_shard)
    return at


def push(ctx: AgGemmContext, a_shard: torch.Tensor, at: Rows) -> None:
    """Step 4 on the current stream: this rank's rows into every peer's G, each
    followed by its flag there."""
    for peer_rows, peer_flag in at.pushes:
        peer_rows.copy_(a_shard)
        signal(ctx, peer_flag)


def signal(ctx: AgGemmContext, peer_flag: torch.Tensor) -> None:
    """A peer's flag of this rank set to 1 after this stream's earlier writes: a 4-byte
    copy of a constant, stream-ordered after the rows (a copy captures into a CUDA
    graph; torch's stream_write_value32 takes no int32 flags)."""
    peer_flag.copy_(ctx.one)


def push_aside(ctx: AgGemmContext, a_shard: torch.Tensor, at: Rows) -> None:
    """Step 4 on the side stream (CUDA), which starts at the barrier of
    :func:`arm_and_meet`; the caller joins it with :func:`join`. On the CPU, in line:
    before the caller's consumer, which waits for the peers' pushes."""
    if ctx.side_stream is None:
        push(ctx, a_shard, at)
        return
    ctx.side_stream.wait_event(ctx.forked)
    torch.cuda.set_stream(ctx.side_stream)
    try:
        push(ctx, a_shard, at)
    finally:
        torch.cuda.set_stream(ctx.caller)


def join(ctx: AgGemmContext) -> None:
    """Step 6: the caller's stream waits for the pushes (so the next call's barrier, and
    any reuse of ``a_shard``'s memory, come after them)."""
    if ctx.side_stream is not None:
        ctx.joined.record(ctx.side_stream)
        ctx.caller.wait_event(ctx.joined)


def caller_stream(ctx: AgGemmContext) -> Any:
    """The current stream of the context's device (by index: the cheap lookup)."""
    return torch.cuda.current_stream(ctx.device.index)
