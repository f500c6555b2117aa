"""The AllGather-GEMM's peer-writable memory, over which :mod:`kernels.ag_gemm_workspace`
lays its protocol: one allocation per rank, its bytes holding the gathered rows ``G``
and, after them, the flags; every peer maps it. Symmetric memory on CUDA (one
allocation, one rendezvous, one barrier), a memory-mapped file per rank on the CPU.

Making one is a collective and, on a GPU, the costliest step of a serving op's start,
so a process keeps one :class:`Workspace` per (process group, device) that every served
layer of that group views (:func:`shared`): ``G`` of a layer is its first
``max_m * K * itemsize`` bytes, as ``[max_m, K]`` of its dtype. A layer too large for it
grows it: a new, larger workspace, made by the same collective at the same op on every
rank (every rank makes its ops in one order), which the layers made after it share; the
layers made before keep theirs. Why layers may share one: see the protocol's docstring.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from kernels import startup
from kernels.collectives import agree

FLAGS_ALIGN = 256  # the flags start at a multiple of this many bytes after the rows


@dataclass(eq=False)
class Workspace:
    """One rank's peer-writable bytes for one process group, and its peers'."""

    group: Any
    rank: int
    world: int
    device: torch.device
    nbytes: int  # the rows' bytes: a layer fits when max_m * K * itemsize <= nbytes
    raw: torch.Tensor  # uint8 [total]: this rank's rows, then its flags
    flags: torch.Tensor  # int32 [world]: flags[src] != 0 once src's rows of a call landed
    peer_raw: list[torch.Tensor] = field(default_factory=list)  # [dst]: dst's bytes, mapped
    peer_flags: list[torch.Tensor] = field(default_factory=list)  # [dst]: dst's flags
    handle: Any = None  # CUDA: the symmetric-memory handle (its barrier)
    side_stream: Any = None  # CUDA: where pushes run
    forked: Any = None  # CUDA events: the side stream starts at the barrier ...
    joined: Any = None  # ... and the caller's stream waits for its end

    def rows(
        self, max_m: int, k: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``G: [max_m, k]`` of ``dtype`` over this rank's bytes, and each peer's."""
        count = max_m * k * dtype.itemsize
        if count > self.nbytes:
            raise ValueError(f"ag_gemm workspace: {count} bytes of rows; it holds {self.nbytes}.")

        def view(raw: torch.Tensor) -> torch.Tensor:
            return raw[:count].view(dtype).view(max_m, k)

        return view(self.raw), [view(raw) for raw in self.peer_raw]


def _flags_at(nbytes: int) -> int:
    return -(-nbytes // FLAGS_ALIGN) * FLAGS_ALIGN


def allocate(group: Any, *, world: int, rank: int, device: torch.device, nbytes: int) -> Workspace:
    """A workspace of its own for ``nbytes`` of rows (a collective over ``group``)."""
    with startup.phase("workspace.map"):
        if device.type == "cuda":
            space = _map_symmetric(group, world, rank, device, nbytes)
        else:
            space = _map_shared_files(group, world, rank, device, nbytes)
    startup.count("workspace.made")
    return space


# one per (group, device): every rank makes the same ones, in one order
_SHARED: dict[tuple[int, str], Workspace] = {}


def shared(group: Any, *, world: int, rank: int, device: torch.device, nbytes: int) -> Workspace:
    """The process's workspace of ``group`` on ``device`` if it holds ``nbytes`` of rows,
    else a larger one that replaces it (a collective then: every rank asks for the same
    sizes in the same order, as it makes its ops)."""
    key = (id(group), str(device))  # the entry keeps its group alive: the id stays its own
    space = _SHARED.get(key)
    if space is not None and space.group is group and space.nbytes >= nbytes:
        startup.count("workspace.reused")
        return space
    _SHARED[key] = space = allocate(group, world=world, rank=rank, device=device, nbytes=nbytes)
    return space


def _map_symmetric(
    group: Any, world: int, rank: int, device: torch.device, nbytes: int
) -> Workspace:
    import torch.distributed._symmetric_memory as symm_mem  # CUDA ranks only (a private module)

    at = _flags_at(nbytes)
    total = at + 4 * world
    with startup.phase("workspace.allocate"):
        raw = symm_mem.empty(total, dtype=torch.uint8, device=device)
    with startup.phase("workspace.rendezvous"):
        handle = symm_mem.rendezvous(raw, group.group_name)
    peer_raw = [handle.get_buffer(dst, (total,), torch.uint8) for dst in range(world)]
    space = Workspace(
        group=group,
        rank=rank,
        world=world,
        device=device,
        nbytes=nbytes,
        raw=raw,
        flags=raw[at:total].view(torch.int32).zero_(),
        peer_raw=peer_raw,
        peer_flags=[peer[at:total].view(torch.int32) for peer in peer_raw],
        handle=handle,
        side_stream=torch.cuda.Stream(device=device, priority=-1),  # type: ignore[no-untyped-call]
        forked=torch.cuda.Event(),  # type: ignore[no-untyped-call]
        joined=torch.cuda.Event(),  # type: ignore[no-untyped-call]
    )
    with startup.phase("workspace.barrier"):
        torch.cuda.current_stream(device).synchronize()  # flags zeroed before any peer signals
        handle.barrier(channel=0)
    return space


def _map_shared_files(
    group: Any, world: int, rank: int, device: torch.device, nbytes: int
) -> Workspace:
    """CPU (tests and the demo: every rank on one x86 host, where the flag's store
    cannot pass the rows'): each rank's bytes in a file in a folder of rank 0's temp
    dir that every rank maps; each rank unlinks its file once all have mapped them (the
    mappings stay), and rank 0 removes the folder."""
    made = tempfile.mkdtemp(prefix="ag-gemm-") if rank == 0 else None
    folder = str(agree(made, group=group, world=world))
    at = _flags_at(nbytes)
    total = at + 4 * world

    def mapped(owner: int) -> torch.Tensor:
        path = os.path.join(folder, f"g{owner}")
        return torch.from_file(path, shared=True, size=total, dtype=torch.uint8)

    raw = mapped(rank)
    flags = raw[at:total].view(torch.int32).zero_()
    with startup.phase("workspace.rendezvous"):
        dist.barrier(group=group)  # every rank's file exists
        peer_raw = [mapped(dst) for dst in range(world)]
        dist.barrier(group=group)  # every rank mapped every file
    os.unlink(os.path.join(folder, f"g{rank}"))
    dist.barrier(group=group)
    if rank == 0:
        os.rmdir(folder)
    return Workspace(
        group=group,
        rank=rank,
        world=world,
        device=device,
        nbytes=nbytes,
        raw=raw,
        flags=flags,
        peer_raw=peer_raw,
        peer_flags=[peer[at:total].view(torch.int32) for peer in peer_raw],
    )
