"""A store's write lock: ``.store.lock`` under its root, taken with ``fcntl`` (filelock).

Every write of a store (a put, an install, a rollback, a recovery, a reader moving a
corrupt file aside) happens under it, so under it nobody else is writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock
from filelock import Timeout as FileLockTimeout

from registry.core import atomic
from registry.core.errors import RegistryError
from registry.storage.generations import is_real_dir
from registry.storage.quarantine import Quarantine

log = logging.getLogger("registry.storage.store")  # the store's log lines keep their logger's name
LOCK_FILE = ".store.lock"


def check_root(root: Path) -> None:
    """:class:`RegistryError` unless ``root`` is a folder, saying how to create a store."""
    if root.is_dir():
        return
    state = "is not a folder" if root.exists() else "does not exist"
    raise RegistryError(
        f"Store '{root}' {state}; check the path, or create the store: "
        "Store(path, create=True), or the CLI's --create-store."
    )


class WriteLock:
    """The write lock of the store at ``root``, waiting ``timeout`` seconds by default.

    ``create``: taking it makes ``root`` first; otherwise a ``root`` removed since is a
    :class:`RegistryError`, not made again unasked.
    """

    def __init__(self, root: Path, quarantine: Quarantine, *, timeout: float, create: bool) -> None:
        self.root = root
        self.quarantine = quarantine
        self.timeout = timeout
        self.create = create
        self._lock = FileLock(str(root / LOCK_FILE), timeout=timeout)

    @property
    def is_locked(self) -> bool:
        """Whether this process holds the lock now."""
        return self._lock.is_locked

    @contextlib.contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[None]:
        """The lock, held for the block; :class:`RegistryError` when it is not acquired
        within ``timeout`` seconds (default: the lock's own)."""
        if self.create:
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            check_root(self.root)  # removed since it was opened: not made again unasked
        wait = self.timeout if timeout is None else timeout
        lock_file = Path(self._lock.lock_file)
        aside = self.folder_aside(lock_file)
        try:
            with self._lock.acquire(timeout=wait):
                if aside is not None:  # its reason is written under the lock, as all writes
                    reason = "a folder where the write lock file belongs"
                    atomic.write_bytes(aside.with_name(aside.name + ".reason"), reason.encode())
                    log.error("store %s: %s -> %s", self.root, reason, aside)
                yield
        except FileLockTimeout:
            raise RegistryError(
                f"Store {self.root}: write lock not acquired within {wait:g} s."
            ) from None

    def folder_aside(self, lock_file: Path) -> Path | None:
        """A folder where the lock file belongs, moved to quarantine (nobody can hold a
        folder, so moving it takes no lock from anyone); where it went, or None. Any other
        odd object (a fifo) stays: flock works on it, and someone may hold it."""
        if not is_real_dir(lock_file):
            return None
        target = self.quarantine.path(lock_file.name)
        self.quarantine.make_folder()
        try:  # the slash: only a folder is moved (ENOTDIR for the file another writer holds)
            os.rename(str(lock_file) + "/", target)
        except (FileNotFoundError, NotADirectoryError):  # another writer moved it first
            return None
        return target
