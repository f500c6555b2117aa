"""The harvest's publisher: what the families' harvests share goes to the remote tier,
in order; what the tier did not take (an outage) is kept, bounded, and sent again
before the next harvest's files, so N pods harvesting one kernel store it once and an
outage loses nothing the memory bound keeps (the volume has it all anyway).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from registry.families.file_harvest import Upload
from registry.remote.tier import RemoteTier

MAX_UNPUBLISHED_BYTES = 64 * 2**20  # kept through a remote outage, then the oldest go


class Publisher:
    """Send uploads to ``remote`` (None: the tier is off, nothing is sent or kept)."""

    def __init__(self, remote: RemoteTier | None, *, max_held: int = MAX_UNPUBLISHED_BYTES):
        self.remote = remote
        self.max_held = max_held
        self._unpublished: OrderedDict[tuple[str, str], Upload] = OrderedDict()

    def publish(self, uploads: Sequence[Upload]) -> bool:
        """The uploads kept from before, then ``uploads``, each in order; at the first
        the tier does not take, it and the rest are kept. Whether all went."""
        if self.remote is None:
            return False
        todo = [*self._unpublished.values(), *uploads]
        self._unpublished.clear()
        for i, upload in enumerate(todo):
            if not upload.send(self.remote, upload):
                self._keep(todo[i:])
                return False
        return True

    def held(self) -> list[Upload]:
        """What waits to be sent again, oldest first."""
        return list(self._unpublished.values())

    def _keep(self, uploads: Sequence[Upload]) -> None:
        for upload in uploads:
            self._unpublished[(upload.key, upload.name)] = upload
        held = sum(len(u.data) for u in self._unpublished.values())
        while held > self.max_held:  # the oldest go: the volume has them
            _, dropped = self._unpublished.popitem(last=False)
            held -= len(dropped.data)
