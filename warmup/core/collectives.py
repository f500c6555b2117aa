"""Collectives between the ranks of a pod, each bounded by a timeout, so that a rank that
died or hangs makes the others fail with a clear error instead of waiting forever.

Rank 0 decides and every rank follows: what crosses ranks is a typed payload (a
:class:`Payload`), sent as its JSON by :meth:`Lockstep.share` and validated on every rank,
so a field misspelt on one side fails at once, not as a ``KeyError`` on the others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

from registry import Entry, KernelConfig, RegistryError
from registry.remote.tiered import TieredFence

J = TypeVar("J")


def _read(kind: type[J], read: Callable[[Any], J]) -> PlainValidator:
    """A registry type's value, or one read from its JSON form (``from_json``); what it
    refuses is a validation error of the payload."""

    def parse(value: Any) -> J:
        if isinstance(value, kind):
            return value
        try:
            return read(value)
        except (RegistryError, KeyError, TypeError) as e:
            raise ValueError(f"not a {kind.__name__}: {e}") from None

    return PlainValidator(parse)


_WRITE = PlainSerializer(lambda value: value.to_json())  # a registry type's JSON form
ConfigJSON = Annotated[KernelConfig, _read(KernelConfig, KernelConfig.from_json), _WRITE]
EntryJSON = Annotated[Entry, _read(Entry, Entry.from_json), _WRITE]
FenceJSON = Annotated[TieredFence, _read(TieredFence, TieredFence.from_json), _WRITE]


class Payload(BaseModel):
    """What rank 0 sends every rank in one collective."""

    model_config = ConfigDict(frozen=True, extra="forbid")


P = TypeVar("P", bound=Payload)


class Answer(Payload):
    """Rank 0's payload, or why rank 0 could not make it (every rank raises alike)."""

    value: dict[str, Any] | None = None
    error: str | None = None


class Located(Payload):
    """A stored entry rank 0 found, and whether the remote tier had it."""

    entry: EntryJSON
    remote: bool = False


class Lookup(Payload):
    found: Located | None = None
    fence: FenceJSON | None = None  # a lookup under the lock


class LockDecision(Payload):
    """The fleet lock: taken (both None), ``deferred`` (another pod holds it: why), or
    ``unlocked`` (its server is silent: the shape is tuned without it; how long)."""

    deferred: str | None = None
    unlocked: str | None = None


class Stored(Payload):
    """The entry that landed: this pod's tuning, or another holder's (``superseded``)."""

    entry: EntryJSON
    superseded: bool = False
    unstored: str | None = None  # tuned, not stored: why (its lock lost)


class Chosen(Payload):
    """A config every rank runs: a search's winner, or a fallback and where it came from."""

    config: ConfigJSON
    source: str = ""


class Candidates(Payload):
    configs: list[ConfigJSON]


class Number(Payload):
    value: float


class LearnedDims(Payload):
    """The shapes traffic taught a compiled model (rank 0's list: every rank warms them)."""

    dims: list[dict[str, int]]


class RankFailure(RuntimeError):
    """A collective did not complete: a peer died, hung or disagreed."""


class Lockstep:
    """Rank 0 decides, every rank follows. ``group=None`` means one process: no collectives."""

    def __init__(self, group: Any = None, *, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist  # torch loads on first use

        self.group = group
        self.timeout_s = timeout_s
        self.active = group is not None and dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.active else 0
        self.world = dist.get_world_size(group) if self.active else 1
        self._device = "cpu"
        self._ping: Any = None  # the 1-element tensor meet() all-reduces
        if self.active and dist.get_backend(group) == "nccl":
            import torch  # torch loads on first use

            self._device = f"cuda:{torch.cuda.current_device()}"

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, value: Any, *, what: str, timeout_s: float | None = None) -> Any:
        """Rank 0's ``value`` (JSON-able) on every rank."""
        if not self.active:
            return value
        import torch  # torch loads on first use

        blob = json.dumps(value).encode() if self.leader else b""
        size = torch.tensor([len(blob)], dtype=torch.int64, device=self._device)
        self._run("broadcast", size, what, timeout_s)
        data = torch.zeros(int(size.item()), dtype=torch.uint8, device=self._device)
        if self.leader:
            data.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        self._run("broadcast", data, what, timeout_s)
        return json.loads(bytes(data.cpu().tolist()).decode())

    def share(
        self, value: P | None, kind: type[P], *, what: str, timeout_s: float | None = None
    ) -> P:
        """Rank 0's ``value`` on every rank, as a ``kind`` (the others pass None); rank 0
        keeps its own object, the others validate what it sent."""
        if not self.leader:
            return kind.model_validate(self.broadcast(None, what=what, timeout_s=timeout_s))
        assert value is not None, "rank 0 shares a value"
        if self.active:
            self.broadcast(value.model_dump(mode="json"), what=what, timeout_s=timeout_s)
        return value

    def max_over_ranks(self, values: list[float], *, what: str) -> list[float]:
        """Element-wise max over ranks: a candidate is as slow as its slowest rank, and
        ``inf`` (a failure) anywhere is ``inf`` everywhere."""
        if not self.active:
            return list(values)
        import torch  # torch loads on first use

        tensor = torch.tensor(values, dtype=torch.float64, device=self._device)
        self._run("all_reduce_max", tensor, what, None)
        return [float(v) for v in tensor.cpu().tolist()]

    def barrier(self, *, what: str) -> None:
        if self.active:
            self._run("barrier", None, what, None)

    def meet(self, *, what: str) -> None:
        """A barrier that releases every rank within microseconds of the others: it spins
        on the collective's completion, where a wait with a timeout polls at intervals
        (a millisecond of skew between ranks, charged to whatever is timed next)."""
        if not self.active:
            return

        import torch.distributed as dist  # torch loads on first use

        deadline = time.monotonic() + self.timeout_s
        try:
            work = dist.all_reduce(self._pinged(), group=self.group, async_op=True)
        except Exception as e:
            raise RankFailure(f"rank {self.rank}/{self.world}: {what} (meet) failed: {e}") from e
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise RankFailure(
                    f"rank {self.rank}/{self.world}: {what} (meet) did not complete "
                    f"within {self.timeout_s:g} s; a peer died or hangs"
                )

    def align(self) -> None:
        """The ranks' current streams meet on the devices (an all-reduce of one element
        that the stream waits for; the host goes on at once): what follows starts on
        every device within microseconds of the others, as a collective does in service,
        where the previous layer's collective keeps the ranks in step."""
        if not self.active:
            return
        import torch.distributed as dist  # torch loads on first use

        dist.all_reduce(self._pinged(), group=self.group)

    def _pinged(self) -> Any:
        """The one-element tensor ``meet`` and ``align`` all-reduce, made at first use
        (they run before every timed repetition)."""
        if self._ping is None:
            import torch  # torch loads on first use

            self._ping = torch.zeros(1, dtype=torch.int32, device=self._device)
        return self._ping

    def _run(self, op: str, tensor: Any, what: str, timeout_s: float | None) -> None:
        import torch.distributed as dist  # torch loads on first use

        limit = timeout_s if timeout_s is not None else self.timeout_s
        try:
            if op == "broadcast":
                work = dist.broadcast(tensor, src=self._global(0), group=self.group, async_op=True)
            elif op == "all_reduce_max":
                work = dist.all_reduce(
                    tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True
                )
            else:
                work = dist.barrier(group=self.group, async_op=True)
            work.wait(timeout=timedelta(seconds=limit))
        except Exception as e:  # gloo: connection closed / timeout; nccl: watchdog
            raise RankFailure(
                f"rank {self.rank}/{self.world}: {what} ({op}) did not complete "
                f"within {limit:g} s; a peer died or hangs: {e}"
            ) from e

    def _global(self, rank: int) -> int:
        import torch.distributed as dist  # torch loads on first use

        return dist.get_global_rank(self.group, rank) if self.group is not None else rank
