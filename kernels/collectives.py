"""The two small collectives that keep the ranks of a group making the same choices:
rank 0's value everywhere (:func:`agree`) and a vote that all must win
(:func:`all_true`). One process (``world == 1``) answers alone, with no call."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def agree(value: Any, *, group: Any, world: int) -> Any:
    """Rank 0's ``value`` on every rank of ``group`` (None: the default group) of
    ``world`` ranks; a collective."""
    if world == 1:
        return value
    holder = [value]
    root = 0 if group is None else dist.get_global_rank(group, 0)
    dist.broadcast_object_list(holder, src=root, group=group)
    return holder[0]


def all_true(flag: bool, *, group: Any, world: int, device: torch.device) -> bool:
    """Whether ``flag`` is true on every rank of ``group``; a collective, on ``device``
    over NCCL and on the CPU over any other backend."""
    if world == 1:
        return flag
    place = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    votes = torch.tensor([int(flag)], dtype=torch.int32, device=place)
    dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=group)
    return bool(votes.item())
