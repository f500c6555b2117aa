"""Crash-safe file writes: temp file beside the target, fsync, os.replace, fsync of the folder."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

TEMP_PREFIX = ".tmp-"
CHUNK_BYTES = 2**20  # what a streaming reader holds at once


def write_bytes(path: Path, data: bytes, *, mode: int = 0o644, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one, whole."""
    with replacing(path, mode=mode, durable=durable) as f:
        f.write(data)


@contextlib.contextmanager
def replacing(path: Path, *, mode: int = 0o644, durable: bool = True) -> Iterator[BinaryIO]:
    """A file to write that replaces ``path`` when the block ends, whole (temp file beside
    it, fsync, ``os.replace``, fsync of the folder); on an error ``path`` stays as it was.
    ``durable=False`` leaves out the fsyncs: still whole for every reader, but a power
    loss may lose it (for a pod's own scratch caches, which a restart refills)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=f"-{path.name}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json(path: Path, value: Any) -> None:
    """Atomically write ``value`` as indented, key-sorted JSON (stable bytes for equal values)."""
    write_bytes(path, dumps(value).encode())


def dumps(value: Any) -> str:
    """The project's one JSON spelling: sorted keys, two-space indent, trailing newline."""
    return json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"


class TooBig(ValueError):
    """A file past the limit its reader gives: by its size when opened, or as it grew."""


def read_bounded(
    path: Path, limit: int, *, follow_links: bool = False, dir_fd: int | None = None
) -> bytes:
    """A regular file's bytes, refused (ValueError) past ``limit``: never a fifo (the open
    does not block), never a GiB, and a link only with ``follow_links`` (OSError ELOOP).
    ``dir_fd``: ``path`` is a name in that open folder (no folder swapped for a link
    meanwhile can lead the read elsewhere)."""
    with open_bounded(path, limit, follow_links=follow_links, dir_fd=dir_fd) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(size + 1)  # what it holds, not the limit: read(n) allocates n bytes
        if len(data) > limit:
            raise TooBig(f"{path.name} is over {limit} bytes")
        if len(data) > size:  # it grows while we read: on in pieces, up to the limit
            data += b"".join(chunks(f, limit - len(data), path.name))
    return data


@contextlib.contextmanager
def open_bounded(
    path: Path, limit: int, *, follow_links: bool = False, dir_fd: int | None = None
) -> Iterator[BinaryIO]:
    """``path`` open for reading, checked as :func:`read_bounded` checks it before it reads
    (a regular file of at most ``limit`` bytes now); read it with :func:`chunks`, which
    keeps the bound while the file grows."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    with os.fdopen(os.open(path, flags, dir_fd=dir_fd), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise TooBig(f"{path.name} is {st.st_size} bytes; limit {limit}")
        yield f


def chunks(file: BinaryIO, limit: int, name: str) -> Iterator[bytes]:
    """What is left of ``file``, in pieces of at most :data:`CHUNK_BYTES`; :class:`TooBig`
    instead of the piece that takes it past ``limit`` bytes (a file that grew)."""
    left = limit + 1  # one byte past the limit is enough to know
    while piece := file.read(min(CHUNK_BYTES, left)):
        left -= len(piece)
        if not left:
            raise TooBig(f"{name} is over {limit} bytes")
        yield piece


def loads(data: bytes | str) -> Any:
    """Parse JSON as the project writes it: ValueError for anything else, a nest too deep
    for the parser and NaN or Infinity included (``dumps`` never writes them)."""
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def json_values(text: bytes) -> int:
    """An upper bound on the values and keys in JSON ``text``, counted without parsing
    it: bytes alone do not bound what a text becomes (``[{},{},...]`` is 3 a value)."""
    return 1 + sum(text.count(c) for c in (b"{", b"[", b",", b":"))


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def copy_file(src: Path, dst: Path, *, limit: int, durable: bool = True) -> int:
    """Copy the regular file ``src`` onto ``dst`` atomically, keeping its permission bits,
    in pieces (never whole in memory); the bytes copied. :class:`TooBig` past ``limit``,
    even when ``src`` grows while copied (``dst`` then stays as it was); a link is not
    followed (OSError ELOOP)."""
    size = 0
    with open_bounded(src, limit) as f:
        mode = os.fstat(f.fileno()).st_mode & 0o777
        with replacing(dst, mode=mode, durable=durable) as out:
            for piece in chunks(f, limit, src.name):
                out.write(piece)
                size += len(piece)
    return size


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_symlink(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` in one rename, as Kubernetes swaps ``..data``."""
    tmp = link.with_name(f"{TEMP_PREFIX}{os.getpid()}-{link.name}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(link.parent)
