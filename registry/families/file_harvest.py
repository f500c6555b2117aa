"""A family's files harvested one by one, as each is finished (the sidecar's harvest
after ready): the limits a family is handed, what it returns, why it refuses a file,
and the bounded reads its checks use.

A family that takes files one by one says which (``Family.file_kind``) and harvests
each (``Family.harvest_file``): read once, at a folder opened without following links,
checked, then written to the volume. What it shares on the remote tier comes back as
:class:`Upload` values, which the sidecar sends (and sends again after an outage).
This module names no family.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from registry.core import atomic

if TYPE_CHECKING:
    from registry.remote.tier import RemoteTier


class Refused(Exception):
    """A file that is not harvested; the message says why, in a few words."""


@dataclass(frozen=True)
class FileLimits:
    """What one harvested entry may hold, checked before it is read."""

    max_file_bytes: int = 64 * 2**20  # one file
    max_entry_bytes: int = 64 * 2**20  # an entry's files together, held in memory once


@dataclass(frozen=True)
class Upload:
    """One file shared on the remote tier: ``data`` as ``name`` of ``key``. ``send``
    publishes it and says whether the tier took it (if not, it is sent again later)."""

    key: str
    name: str
    data: bytes
    send: Callable[[RemoteTier, Upload], bool] = field(compare=False, repr=False)


@dataclass(frozen=True)
class Harvested:
    """What one file's harvest did: ``result`` is harvested (new on the volume) or
    deduplicated (the volume had it); ``size`` its bytes; ``uploads`` what to share."""

    result: str
    size: int
    uploads: tuple[Upload, ...] = ()


@contextlib.contextmanager
def opened(folder: Path) -> Iterator[int]:
    """``folder`` opened as a directory, never through a link: its files are read at it,
    so a folder swapped for a link meanwhile cannot lead a read elsewhere."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise Refused(f"its folder is a link or gone: {e.strerror or e}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def read_at(folder: int, name: str, limit: int) -> bytes:
    """A regular file's bytes in the open ``folder``, read once (what is checked is
    what is written), refused past ``limit`` before it is read."""
    try:
        return atomic.read_bounded(Path(name), limit, dir_fd=folder)
    except ValueError as e:
        raise Refused(f"{e}; the limit left is {limit}") from None
    except OSError as e:
        raise Refused(f"{name}: {e.strerror or e}") from None


def temporary(name: str) -> bool:
    """Whether a file name is a writer's temporary file (never harvested: its finished
    file arrives by rename)."""
    return name.startswith((".", "tmp", atomic.TEMP_PREFIX)) or name.endswith((".tmp", ".lock"))
