"""Reading a gzip'd tar archive once, forward, in bounded memory, whatever its bytes.

- A member's tar headers (header block, GNU long names, PAX or sparse records) are
  capped: a read that would take them past the limit is refused before tarfile reads,
  let alone parses, the bytes (tarfile reads a 1 GiB long name in one ``read``).
- :func:`members` yields the members in stream order and forgets each: no list of them.
- :func:`chunks` reads a member's data in pieces of at most :data:`CHUNK` bytes.
- :class:`Hashed` gives the sha256 of the whole file in the same pass.
- :func:`tail` reads to the end of the gzip stream (checking its CRC) and refuses more
  than :data:`TAIL_BYTES` after the end of the archive.

Every fault of the archive, including any error of gzip, zlib or tarfile on hostile
bytes, is a :class:`TarRejected` with its reason.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from registry.errors import why

CHUNK = 2**20  # members are read, hashed and staged in pieces of this size
TAIL_BYTES = 2**20  # zero records a tar writer may pad its archive with after the end marker


class TarRejected(Exception):
    """The archive is unreadable or exceeds a limit; ``reason`` says which and where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Hashed:
    """The raw archive file, hashed as gzip reads it: the file's sha256 in the same pass."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw, self._sha = raw, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size if 0 <= size <= CHUNK else CHUNK)
        self._sha.update(data)
        return data

    def seek(self, offset: int, /) -> int:
        raise io.UnsupportedOperation("read once, forward")  # a rewind would hash bytes twice

    def hexdigest(self) -> str:
        while self.read(CHUNK):  # bytes after the gzip stream belong to the file too
            pass
        return self._sha.hexdigest()


class _Headers:
    """What tarfile reads through. tarfile reads a GNU long name or a PAX record with one
    ``read(size)``, then parses it: refusing a read that would take a member's headers
    past the limit stops a 1 GiB header before anything allocates it."""

    def __init__(self, gz: gzip.GzipFile, limit: int) -> None:
        self.gz, self.limit = gz, limit
        self.used = 0  # header bytes read for the member being parsed
        self.after = ""  # the member before it, to name in a refusal

    def read(self, size: int = -1) -> bytes:
        if size < 0 or self.used + size > self.limit:
            which = f"the member after '{self.after}'" if self.after else "the first member"
            raise TarRejected(
                f"{which} has more than {self.used + max(size, 0)} bytes of tar headers "
                f"(GNU long name, PAX or sparse records); limit {self.limit}"
            )
        self.used += size
        return self.gz.read(size)

    def tell(self) -> int:
        return self.gz.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.gz.seek(offset, whence)  # forward only: tarfile skips padding

    def write(self, data: bytes) -> int:
        raise io.UnsupportedOperation("the archive is read only")

    def close(self) -> None:
        """The gzip stream belongs to the caller."""


class _Tar(tarfile.TarFile):
    """A TarFile that forgets each member once returned: it keeps no list of them all."""

    members: list[tarfile.TarInfo]

    def next(self) -> tarfile.TarInfo | None:
        info = super().next()
        self.members.clear()
        return info


def members(gz: gzip.GzipFile, max_header_bytes: int) -> Iterator[tarfile.TarInfo]:
    """The archive's members in stream order, each with at most ``max_header_bytes`` of
    tar headers. Read each one's data with :func:`chunks` before asking for the next."""
    headers = _Headers(gz, max_header_bytes)
    try:
        tar = _Tar(fileobj=headers, mode="r")  # reads the first header
        while True:
            info = tar.next()
            if info is None:
                return
            if tar.pax_headers:
                raise TarRejected(f"member '{info.name}' follows a PAX global header")
            headers.after = info.name
            yield info
            headers.used = 0
    except TarRejected:
        raise
    except Exception as e:  # any failure of gzip, zlib or tarfile on hostile bytes
        raise TarRejected(f"not a readable tar.gz archive ({why(e)})") from None


def chunks(gz: gzip.GzipFile, name: str, size: int) -> Iterator[bytes]:
    """A member's ``size`` bytes of data, in pieces of at most :data:`CHUNK`."""
    left = size
    while left:
        try:
            chunk = gz.read(min(CHUNK, left))
        except Exception as e:  # zlib.error, EOFError, gzip.BadGzipFile
            raise TarRejected(f"member '{name}' is unreadable ({why(e)})") from None
        if not chunk:
            raise TarRejected(f"member '{name}' ends after {size - left} of {size} bytes")
        left -= len(chunk)
        yield chunk


def tail(gz: gzip.GzipFile) -> None:
    """Read to the end of the gzip stream, which checks its CRC; refuse a long tail."""
    try:
        rest = gz.read(TAIL_BYTES + 1)
    except Exception as e:
        raise TarRejected(f"not a readable tar.gz archive ({why(e)})") from None
    if len(rest) > TAIL_BYTES:
        raise TarRejected(f"more than {TAIL_BYTES} bytes follow the end of the archive")
