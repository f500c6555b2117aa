"""Staging a bundle's files in a family's folder: ``<folder>/.bundle-*`` holds them until
the store took the bundle's entries, then each moves in with one rename.

A stage is read into before the store's write lock is taken (the archive is streamed
first, the lock held only for the swap), so the lock says nothing of whether a stage is
in use. Each stage therefore holds a lock of its own for its whole life: the file
``.lock`` inside it, locked with ``flock`` by the install that made it, which the kernel
lets go when that process dies, kill -9 included. :func:`remove_stale_stages` removes a
stage only when it can take that lock: never one a live install, in this process or
another, still uses. The lock file is made under another name, locked, then renamed to
``.lock``, so no cleaner ever finds it there unlocked while its install lives. A stage
without the file (its install killed between making the folder and locking it, or made
by an older version) is removed once it is :data:`LOCKLESS_STALE_S` old.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from registry.core import atomic
from registry.core.errors import BundleRejected

log = logging.getLogger(__name__)
STAGING_PREFIX = ".bundle-"  # bundle.install stages a family's files in such a folder
STAGE_LOCK = ".lock"  # inside a stage: flock-ed by its install for the stage's whole life
_LOCKING = ".lock-new"  # the lock file before it is locked and renamed to STAGE_LOCK
LOCKLESS_STALE_S = 3600.0  # a stage with no lock file: a live install makes one at once


class Stage:
    """Files wait in ``<root>/.bundle-*`` (same file system: a rename moves each) until
    the store holds the entries; on failure the folder goes, and so do the folders it had
    to create."""

    def __init__(self, root: Path) -> None:
        self.cache = root
        self.root: Path | None = None
        self._made: list[Path] = []  # folders this install created, deepest first
        self._lock: int | None = None  # the stage's lock file, held open and locked
        self.moved: list[str] = []  # files committed into the folder

    def write(self, label: str, rel: str, chunks: Iterable[bytes]) -> None:
        """Write a file from ``chunks``; the bundle's own faults reject, and so does any
        failure of the file system (a path too long, a full disk)."""
        final = self.cache / rel
        try:
            if final.is_dir() or (final.parent.exists() and not final.parent.is_dir()):
                raise BundleRejected(label, f"artifact '{rel}' cannot replace what is at {final}")
            target = self._folder() / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("xb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise BundleRejected(
                label, f"cannot stage artifact '{rel}' in {self.root}: {e}"
            ) from None

    def _folder(self) -> Path:
        if self.root is None:
            missing = itertools.takewhile(
                lambda p: not p.exists(), [self.cache, *self.cache.parents]
            )
            self._made = list(missing)
            self.cache.mkdir(parents=True, exist_ok=True)
            self.root = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.cache))
            self._lock = _lock_stage(self.root)
        return self.root

    def commit(self, files: list[str]) -> None:
        """Move every staged file in, each with one rename. Called after the store swap,
        so it never raises: one that cannot move is logged and left out (it is compiled
        or written again by its user)."""
        if self.root is None or not files:
            return
        folders, failed = set(), []
        for rel in files:
            target = self.cache / rel
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.root / rel, target)
            except OSError as e:
                failed.append(f"{rel}: {e}")
                continue
            self.moved.append(rel)
            folders.add(target.parent)
        for folder in sorted(folders):
            atomic.fsync_dir(folder)
        if failed:
            log.error(
                "%d of %d artifacts not moved into the cache %s (made again where they are "
                "needed); first: %s",
                len(failed),
                len(files),
                self.cache,
                failed[0],
            )

    def discard(self, *, failed: bool) -> None:
        """Remove the stage's folder, then let go of its lock; ``failed``: the folders
        it had to create go too."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        for folder in self._made if failed else ():
            with contextlib.suppress(OSError):
                folder.rmdir()


def _lock_stage(folder: Path) -> int:
    """Lock the new stage ``folder`` as in use for as long as the returned descriptor
    stays open: its lock file is made aside, locked, then renamed into place."""
    temp = folder / _LOCKING
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(temp, folder / STAGE_LOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_stale_stages(root: Path, *, lockless_after_s: float = LOCKLESS_STALE_S) -> int:
    """Remove the stages in the family folder ``root`` that no live install uses (module
    docstring); how many were removed. Safe beside installs running in any process."""
    try:
        found = sorted(root.glob(f"{STAGING_PREFIX}*"))
    except OSError:
        return 0
    removed = sum(_remove_if_stale(stage, lockless_after_s) for stage in found)
    if removed:
        log.info("removed %d staging folders of killed installs in %s", removed, root)
    return removed


def _remove_if_stale(stage: Path, lockless_after_s: float) -> bool:
    try:
        st = stage.lstat()
    except OSError:
        return False  # removed meanwhile, by another cleaner or its install
    if not stat.S_ISDIR(st.st_mode):
        return False  # no stage: mkdtemp makes folders
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a fifo never blocks
    try:
        fd = os.open(stage / STAGE_LOCK, flags)
    except FileNotFoundError:
        if time.time() - st.st_mtime < lockless_after_s:
            return False  # maybe an install between making its folder and locking it
        shutil.rmtree(stage, ignore_errors=True)
        return True
    except OSError:
        return False
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # not an install's lock: left alone
        os.close(fd)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # EWOULDBLOCK: its install is alive
        os.close(fd)
        return False
    try:  # its install is gone, and no other ever takes this folder again
        shutil.rmtree(stage, ignore_errors=True)
    finally:
        os.close(fd)
    return True
