"""One layer's tuned configs as the registry holds them: what a serving op's table is made of.

A read never mixes two generations (it reads again while the registry moves under it),
and in a tensor-parallel group every rank takes rank 0's configs, so that every rank
builds the same table and runs the same algorithm at each call.
"""

from __future__ import annotations

import logging

from kernels import startup
from kernels.adapter import BUCKET_FIELD, Layer, Served
from registry import KernelConfig, Store
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.storage import keys

log = logging.getLogger("warmup.serving.ops")  # the name these logs had: filters hold
READS = 3  # reads of a registry that moves under them before one is taken anyway

Tuned = dict[int, KernelConfig]  # M -> the best stored config of the layer


class LayerReader:
    """Reads one served layer's entries from ``store`` (the fingerprint matched by
    ``match_policy``); :attr:`version` is the registry version of the last read, or
    ``()`` when rank 0's agreed configs came from another generation than this rank's."""

    def __init__(
        self,
        served: Served,
        layer: Layer,
        *,
        store: Store,
        fingerprint: Fingerprint,
        match_policy: MatchPolicy,
    ) -> None:
        self.served, self.layer, self.kernel = served, layer, served.kernel
        self.store, self.fingerprint, self.match_policy = store, fingerprint, match_policy
        self.version: tuple[object, ...] = ()  # the registry version the last read saw

    def read(self) -> Tuned:
        """This layer's tuned configs as the registry holds them now; read again if the
        registry changed meanwhile, so no table mixes two generations."""
        for _ in range(READS):
            before = self.store.version
            tuned = self._tuned_configs()
            if self.store.version == before:
                break
        self.version = self.store.version
        return tuned

    def read_agreed(self) -> tuple[Tuned, Tuned]:
        """(this rank's configs, rank 0's) as the registry holds them now; a collective
        for a tensor-parallel layer: a rank that cannot read still takes part."""
        try:
            with startup.phase("table.read.local"):
                mine = self.read()
        except Exception:  # a rank that skips the agree leaves the others waiting in it
            if not self.served.collective:
                raise
            log.exception("%s %s: could not read the registry; agreeing", self.kernel, self.layer)
            mine = {}
        with startup.phase("table.read.agree"):
            agreed = self._agreed(mine)
        if agreed != mine:
            self.version = ()  # rank 0 read another generation: the follower reads again
        return mine, agreed

    def no_entries(self) -> str:
        """Why a layer with no entry cannot be served, and what to do."""
        held = sum(1 for e in self.store.entries() if e.kernel == self.kernel)
        layer = keys.without(self.served.key(1), BUCKET_FIELD)
        return (
            f"No tuned {self.kernel} config for layer {layer} "
            f"on {self.fingerprint.gpu_slug()} (match policy "
            f"{self.match_policy.value}) in {self.store.root}; it holds {held} "
            f"{self.kernel} entries for other layers or machines. Warm a manifest with this "
            "layer's shapes first, or pass on_missing='fallback' (counted per call)."
        )

    def _agreed(self, tuned: Tuned) -> Tuned:
        """Rank 0's configs on every rank of a tensor-parallel group."""
        agreed = self.served.agree({m: config.to_json() for m, config in tuned.items()})
        return {int(m): KernelConfig.from_json(c) for m, c in agreed.items()}

    def _tuned_configs(self) -> Tuned:
        """M -> the best stored config of this layer, one lookup per stored M."""
        layer = self.store.like(
            self.kernel,
            self.served.key(1),
            self.fingerprint,
            self.match_policy,
            free=BUCKET_FIELD,
        )
        return {m: entry.best for m, entry in layer.items()}
