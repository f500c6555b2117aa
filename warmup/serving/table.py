"""A serving op's table: one registry generation's configs for a layer, indexed by M.

A tuned M takes its own config; any other the nearest tuned M's (log distance, the
tuner's fallback rule; a tie goes to the larger M): a call picks its config with one
list index (:mod:`warmup.serving.serving_op`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

from registry import KernelConfig
from registry.storage import keys

REHEARSALS = 8  # real calls an op makes when made, at most: one per config
SOURCES = ("tuned", "nearest", "fallback")  # how a call's config was chosen
TUNED, NEAREST, FALLBACK = range(3)


@dataclass(frozen=True)
class Table:
    """One registry generation's configs for a layer: ``pick[m // step]`` indexes
    ``configs``; ``source[m // step]`` says how (TUNED, NEAREST, FALLBACK)."""

    buckets: tuple[int, ...]  # the tuned Ms
    configs: tuple[KernelConfig, ...]
    pick: list[int]
    source: list[int]

    def config_for(self, index: int) -> KernelConfig:
        """The config of a call at ``index`` (its M // step)."""
        return self.configs[self.pick[index]]


def rehearsal(table: Table) -> list[KernelConfig]:
    """The configs an op rehearses when made: each once, most used first, up to
    REHEARSALS (a config's second call pays nothing its first did not). A collective
    op's ranks rehearse as many: they all made their table of rank 0's configs."""
    uses = sorted(range(len(table.configs)), key=lambda i: -table.pick.count(i))
    return [table.configs[i] for i in uses[:REHEARSALS]]


def nearest_table(tuned: Mapping[int, KernelConfig], *, step: int, max_m: int) -> Table:
    """For every M = index * step up to ``max_m``: its own bucket's config, else the
    nearest bucket's by log distance (a tie goes to the larger M)."""
    buckets = tuple(sorted(tuned))
    configs = tuple(dict.fromkeys(tuned[m] for m in buckets))
    slot_of = {m: configs.index(tuned[m]) for m in buckets}
    pick, source = [0], [TUNED]  # index 0 (M = 0) is never called
    for index in range(1, max_m // step + 1):
        m = index * step
        at = bisect.bisect_left(buckets, m)
        if at < len(buckets) and buckets[at] == m:
            pick.append(slot_of[m])
            source.append(TUNED)
            continue
        below = buckets[at - 1] if at > 0 else None
        above = buckets[at] if at < len(buckets) else None
        nearest = _nearest(m, below, above)
        pick.append(slot_of[nearest])
        source.append(NEAREST)
    return Table(buckets, configs, pick, source)


def _nearest(m: int, below: int | None, above: int | None) -> int:
    """The nearer of two tuned Ms (:func:`registry.storage.keys.log_distance`); a tie goes to
    the larger."""
    if below is None or above is None:
        return above if below is None else below  # type: ignore[return-value]
    return below if keys.log_distance(m, below) < keys.log_distance(above, m) else above
