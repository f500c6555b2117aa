"""The remote tier's publish queue (:mod:`registry.remote.tier`): entries not published while
the tier was down, kept with their fences and published once it answers again.

One entry is kept per field, the newest (the local store's merge of all before it). The
queue drains when any call of the tier answers (:attr:`Transport.on_answer`), until one
of its publishes fails (the tier is down again), and at the end of a run by
:meth:`PublishQueue.flush`, which does not wait for the tier's skip to end.
"""

from __future__ import annotations

import functools

from registry.core.entry import Entry
from registry.core.errors import Superseded
from registry.remote.calls import log
from registry.remote.fence import Fence
from registry.remote.transport import Transport, Unanswered
from registry.remote.values import slot_name


class PublishQueue:
    """Entries kept back during an outage, each with its fence, published through
    ``transport`` by ``fence`` once the tier answers."""

    def __init__(self, transport: Transport, fence: Fence) -> None:
        self.transport = transport
        self.fence = fence
        self._kept: dict[tuple[str, str], tuple[Entry, str | None]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, entry: Entry, seen: str | None) -> None:
        """Keep ``entry`` (with its fence ``seen``) for later: the newest of its field."""
        field = (slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest())
        self._kept[field] = (entry, seen)

    def drain(self) -> None:
        """Publish the kept-back entries until one fails (the tier is down again); the
        tier is up again once they all went."""
        for field, (entry, seen) in list(self._kept.items()):
            publish = functools.partial(self.fence.publish, entry=entry, seen=seen)
            try:
                self.transport.attempt(
                    publish, key=field[0], passes=(Superseded,), ends_outage=False
                )
            except Superseded:
                pass  # counted and logged: another pod's entry stays
            except Unanswered:
                return
            del self._kept[field]
            if not self._kept:
                self.transport.answered()

    def flush(self) -> int:
        """Publish the entries kept back, now (even while the tier is skipped); the
        number still unpublished, warned about. Never raises."""
        if self._kept:
            self.transport.calls.retry_now()
            self.drain()
        if self._kept:
            log.warning(
                "remote tier %s: %d tuned entries not published (it did not answer); they "
                "are in this pod's local tier, and the next run publishes them as it tunes",
                self.transport.describe(),
                len(self._kept),
            )
        return len(self._kept)
