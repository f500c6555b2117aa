"""A store's ``quarantine/`` folder: what holds no entry, or stands where a store's own
file belongs, is moved there, never deleted, with a ``<name>.reason`` file beside it.

Only :class:`registry.storage.store.Store` and its collaborators move things here, under the
store's write lock; any process may count what is there.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from registry.core import atomic
from registry.storage.generations import is_real_dir

QUARANTINE = "quarantine"


class Quarantine:
    """The quarantine of the store at ``root``. ``moved``: the files this process set
    aside because they held no entry (what ``Store.quarantined`` reports)."""

    def __init__(self, root: Path) -> None:
        self.folder = root / QUARANTINE
        self.moved = 0

    def path(self, name: str) -> Path:
        """A fresh name in quarantine/: the time, then a random part (never overwritten)."""
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        return self.folder / f"{stamp}-{name}"

    def make_folder(self) -> None:
        """Make quarantine/ a folder; a file where it belongs is renamed aside, kept."""
        if os.path.lexists(self.folder) and not is_real_dir(self.folder):
            os.replace(self.folder, self.folder.with_name(f"{QUARANTINE}.{secrets.token_hex(3)}"))
        self.folder.mkdir(parents=True, exist_ok=True)

    def move_aside(self, path: Path, target: Path, reason: str) -> None:
        """Move ``path`` (a file or a folder) to ``target`` in quarantine/, saying why."""
        self.make_folder()
        os.replace(path, target)
        atomic.write_bytes(target.with_name(target.name + ".reason"), reason.encode())

    def set_aside(self, path: Path, target: Path, reason: str) -> None:
        """Quarantine a file that holds no entry, and count it."""
        self.move_aside(path, target, reason)
        self.moved += 1

    def count(self) -> int:
        """Files and folders in quarantine/, moved there by any process: what a metric shows."""
        try:
            return sum(1 for p in self.folder.iterdir() if p.suffix == ".reason")
        except OSError:
            return 0
