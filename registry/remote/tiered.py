"""The registry's two tiers: the local store (the volume) and, behind it, the remote tier.

A lookup asks the local store first; on a miss it asks the remote tier and files a hit
in the local store, so the next lookup stays local. A put writes the local store (its
errors raise as always), then publishes what the store now holds. The remote tier never
raises: while it is down, the local store works alone, as it does without one.

A fenced put (:meth:`TieredStore.fence`, then ``put(entry, fence=...)``) is fenced in
both tiers, each on its own: the local put raises ``Superseded`` (nothing written, not
published) when another holder stored the entry first on this volume; once it landed,
the publish is refused when another pod published it first (pods that share only
redis): the put raises ``Superseded`` too, with the other pod's entry (``held``), which
the writer takes; it is filed in the local store too (merged with this pod's there: the
earliest tuning wins).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from registry.core.entry import Entry
from registry.core.errors import RegistryError, Superseded
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.remote.tier import RemoteTier
from registry.storage.keys import Key
from registry.storage.store import Fence, Store

log = logging.getLogger(__name__)
EXACT = MatchPolicy.EXACT

Tier = Literal["local", "remote"]


@dataclass(frozen=True)
class TieredFence:
    """A fence in each tier: the local store's, and what the remote field held (None
    only without a remote tier; "" when the field was empty, or the tier did not answer:
    its publish lands only if the field is still empty)."""

    local: Fence
    remote: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"local": self.local.to_json(), "remote": self.remote}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TieredFence:
        remote = data.get("remote")
        return cls(Fence.from_json(data["local"]), None if remote is None else str(remote))


class TieredStore:
    """The local store first (the volume, works alone as today); the remote tier on a local miss."""

    def __init__(self, local: Store, remote: RemoteTier | None = None) -> None:
        self.local = local
        self.remote = remote

    @property
    def lock_timeout(self) -> float:
        return self.local.lock_timeout

    def locate(
        self,
        kernel: str,
        key: Mapping[str, Any],
        fingerprint: Fingerprint,
        policy: MatchPolicy = EXACT,
        *,
        remote_now: bool = False,
        keep: Callable[[Entry], bool] | None = None,
    ) -> tuple[Entry, Tier] | None:
        """The entry for ``kernel`` at ``key`` valid for ``fingerprint`` and the tier it
        came from, or None (a miss in both). ``remote_now``: ask the remote tier even
        while it is skipped after a failure (before a tuning that it may spare). ``keep``:
        a remote entry it refuses is answered but not filed in the local store (the
        caller will not use it, and its own fenced put must still land)."""
        found = self.local.lookup(kernel, key, fingerprint, policy)
        if found is not None:
            return found, "local"
        if self.remote is None:
            return None
        fetched = self.remote.fetch(kernel, key, fingerprint, policy, now=remote_now)
        if fetched is None:
            return None
        if keep is not None and not keep(fetched):
            return fetched, "remote"
        return self._keep(fetched), "remote"

    def lookup(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy = EXACT
    ) -> Entry | None:
        """:meth:`locate`'s entry."""
        found = self.locate(kernel, key, fingerprint, policy)
        return found[0] if found is not None else None

    def fence(self, kernel: str, key: Mapping[str, Any], fingerprint: Fingerprint) -> TieredFence:
        """Both tiers' fences for the entry of ``kernel`` at ``key`` for ``fingerprint``,
        taken before the lookup that decides to tune (module docstring)."""
        local = self.local.fence(kernel, key, fingerprint)
        remote = self.remote.seen(kernel, key, fingerprint) if self.remote else None
        return TieredFence(local, remote)

    def put(self, entry: Entry, *, fence: TieredFence | None = None) -> Entry:
        """Merge ``entry`` into the local store, then publish what it holds now; with a
        ``fence``, ``Superseded`` from the local store (module docstring)."""
        stored = self.local.put(entry, fence=fence.local if fence else None)
        if self.remote is None:
            return stored
        if fence is None:
            self.remote.publish(stored)
            return stored
        try:
            self.remote.publish_fenced(stored, seen=fence.remote)
        except Superseded as e:
            if e.held is not None:
                self._keep(e.held)
            raise
        return stored

    def entries(self) -> list[Entry]:
        """The local store's entries (the remote tier is not listed)."""
        return self.local.entries()

    def nearest(
        self, kernel: str, key: Key, fingerprint: Fingerprint, policy: MatchPolicy = EXACT
    ) -> Entry | None:
        """The local store's nearest entry (:meth:`Store.nearest`)."""
        return self.local.nearest(kernel, key, fingerprint, policy)

    def _keep(self, entry: Entry) -> Entry:
        """``entry`` from the remote tier, filed in the local store where it can be."""
        try:
            return self.local.put(entry)
        except (RegistryError, OSError) as e:  # a read-only volume, a busy lock
            log.warning(
                "registry: remote entry %s not kept in the local store %s: %s",
                entry.relpath(),
                self.local.root,
                e,
            )
            return entry
