"""A serving op: one layer's kernel with a tuned config per call, and its table's refresh.

A serving op loads every registry entry of its layer (kernel, N, K, dtype, world; the
fingerprint matched by the settings' policy) into a table indexed by M, so a call picks
its config with one list index: no disk, no tuning, no compile on the request path.
Making an op is a collective for a tensor-parallel kernel (every rank makes it), and
ends with real calls at the smallest M, one per config, so a first request costs what
a steady one does.
An M with no entry of its own takes the nearest tuned M's config (log distance, the
tuner's fallback rule; a tie goes to the larger M). Every config of the table is built
(compiled or loaded, GPU module loaded) when the table is made.

A new generation (a hot-reloaded bundle, another pod's tuning) builds a new table off the
request path and swaps it in with one assignment. Each rank swaps on its own, so a swap
must be safe whichever call each rank takes it at: every call of a tensor-parallel op is
a collective, and every rank must run the same algorithm at each call. A new table that
changes block shapes only swaps at once (:meth:`ServingOp.refresh`); one that changes an
M's algorithm in a collective op is built and kept pending until :meth:`ServingOp.sync`,
a collective that every rank calls at the same point (a step boundary).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from kernels import startup
from registry import KernelConfig
from warmup.serving.layer_reader import LayerReader, Tuned
from warmup.serving.table import Table, rehearsal
from warmup.serving.table_builder import TableBuilder

log = logging.getLogger("warmup.serving.ops")  # the name these logs had: filters hold
OnMissing = Literal["error", "fallback"]


class ServingError(ValueError):
    """A serving op cannot be made: no tuned entry for the layer, or bad arguments."""


class ServingOp:
    """One layer's kernel with a config per call; see the module docstring. Made by
    :meth:`warmup.serving.ops.Serving.op`. Call it with the kernel's inputs:
    ``op(a_shard, b, out=None)``."""

    def __init__(self, reader: LayerReader, *, on_missing: OnMissing) -> None:
        """``reader`` reads the served layer's entries from the registry (a collective
        for a tensor-parallel layer: every rank makes its op)."""
        served, layer = reader.served, reader.layer
        self.served, self.layer, self.kernel = served, layer, served.kernel
        self.step = served.rows_step
        self.on_missing = on_missing
        self.reader = reader
        self.builder = TableBuilder(served, layer)
        self.calls = [0, 0, 0]  # by source; the follower exports them
        self.pending: Table | None = None  # built, waiting for Serving.sync(): see refresh()
        self._pending_tuned: Tuned | None = None
        self._rejected: Tuned | None = None  # an agreed table that failed
        # Every rank takes rank 0's table: the same error, the same rehearsal collectives.
        with startup.phase("table.read"):
            self.tuned = self.reader.read_agreed()[1]  # M -> config: what the table is made of
        with startup.phase("table.build"):
            self.table = self.builder.table(self.tuned)
        if not self.table.buckets and on_missing == "error":
            raise ServingError(self.reader.no_entries())
        with startup.phase("table.prepare"):
            self.builder.prepare(self.table)
        served.rehearse(rehearsal(self.table))  # every rank makes its ops together

    @property
    def version(self) -> tuple[object, ...]:
        """The registry version the table was last checked against (``()``: read again)."""
        return self.reader.version

    @property
    def collective(self) -> bool:
        """Every rank must take an algorithm change together (a tensor-parallel op)."""
        return bool(self.served.collective)

    def __call__(self, *inputs: Any, out: Any = None) -> Any:
        table = self.table  # one read: a swap between calls never splits a call
        m = self.served.rows(*inputs)
        index = m // self.step
        if not 0 < index < len(table.pick):
            raise ValueError(
                f"{self.kernel}: a call of M={m} rows; this op serves 1..{self.layer.max_m}."
            )
        self.calls[table.source[index]] += 1
        return self.served(table.configs[table.pick[index]], *inputs, out=out)

    def in_graph(self) -> Any:
        """This op as a callable ``(a, b) -> out`` for a ``torch.compile``d model's
        forward: a registered custom op, opaque to Dynamo (no graph break, no trace into
        the kernel); see :mod:`warmup.serving.in_graph`."""
        from warmup.serving.in_graph import in_graph  # registers torch custom ops

        return in_graph(self)

    def config_for(self, m: int) -> KernelConfig:
        """The config a call of ``m`` rows runs with."""
        if not 0 < m <= self.layer.max_m or m % self.step:
            raise ValueError(
                f"{self.kernel}: M={m} is not a multiple of {self.step} in 1..{self.layer.max_m}."
            )
        return self.table.config_for(m // self.step)

    def refresh(self) -> bool:
        """Rebuild from the registry as it is now and swap the table in if it changed and
        the swap is safe on this rank alone; builds new configs first. Called by the
        follower, never by a request. Each rank swaps on its own, at whichever call it
        sees the generation, so a swap must not change what the ranks run together: a
        collective op swaps only a table whose every M keeps its algorithm (block shapes
        change, the ranks compute the same result). A table that changes an M's algorithm
        is built and kept in :attr:`pending` (warned once) until :meth:`sync`."""
        tuned = self.reader.read()
        if tuned == self.tuned:
            self._set_pending(None, None)  # the registry is back at this table
            return False
        if not tuned:
            self._warn_empty()
            return False
        if tuned == self._pending_tuned:
            return False  # built already, waiting for a sync
        new = self.builder.built(tuned)
        changed = self._algorithm_changes(new) if self.collective else []
        if changed:
            self._set_pending(new, tuned)
            log.warning(
                "%s %s: the registry's new table changes the algorithm at %d Ms (M %d..%d); "
                "ranks must take it together, so it waits, built: call serving.sync() on "
                "every rank at a step boundary",
                *(self.kernel, self.layer, len(changed), changed[0], changed[-1]),
            )
            return False
        self._swap(new, tuned)
        return True

    def sync(self) -> bool:
        """Take rank 0's table on every rank of the group and swap it in, algorithm
        changes included; a collective: every rank calls it at the same point. It makes
        two collectives per call, whether anything changed or not: the agreement on rank
        0's table, and one on whether every rank built it (a rank that failed, out of
        memory say, keeps every rank on the old table). See
        :meth:`warmup.serving.ops.Serving.sync`."""
        mine, tuned = self.reader.read_agreed()
        if self._pending_tuned is not None and self._pending_tuned != mine:
            self._set_pending(None, None)  # this rank's registry moved on from it
        new, failed = None, False
        if not tuned:
            self._warn_empty()
        elif tuned != self.tuned and tuned != self._rejected:
            try:
                new = self.pending if tuned == self._pending_tuned else None
                new = new or self.builder.built(tuned)
            except Exception:
                log.exception("%s %s: the agreed table failed to build", self.kernel, self.layer)
                failed = True
        if not self.served.all_true(not failed):
            log.warning(
                "%s %s: a rank could not build the table; every rank keeps its own",
                self.kernel,
                self.layer,
            )
            self._rejected = tuned  # not built again at every sync
            return False
        if new is None:
            return False
        self._swap(new, tuned)
        return True

    def _swap(self, new: Table, tuned: Tuned) -> None:
        self.table, self.tuned = new, tuned  # one assignment each: a call reads table once
        self._set_pending(None, None)
        self._rejected = None
        log.info("%s %s: new table, tuned M %s", self.kernel, self.layer, list(new.buckets))

    def _set_pending(self, table: Table | None, tuned: Tuned | None) -> None:
        self.pending, self._pending_tuned = table, tuned

    def _algorithm_changes(self, new: Table) -> list[int]:
        """The Ms at which ``new`` runs another algorithm than the current table."""
        old = [config.algorithm for config in self.table.configs]
        now = [config.algorithm for config in new.configs]
        picks = zip(self.table.pick, new.pick, strict=True)
        return [i * self.step for i, (a, b) in enumerate(picks) if i and old[a] != now[b]]

    def _warn_empty(self) -> None:
        log.warning(
            "%s %s: the registry lost every entry; keeping the table", self.kernel, self.layer
        )
