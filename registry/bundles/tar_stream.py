"""Reading a gzip'd tar archive once, forward, in bounded memory, whatever its bytes.

- A member's tar headers (header block, GNU long names, PAX or sparse records) are
  capped: a read that would take them past the limit is refused before tarfile reads,
  let alone parses, the bytes (tarfile reads a 1 GiB long name in one ``read``).
- A PAX record with a run of more than :data:`MAX_PAX_DIGITS` digits is refused before
  tarfile parses it: before Python 3.11.10 / 3.12.6 its regex takes quadratic time on
  such a run (CVE-2024-6232).
- A member of negative size (a base-256 size field, a PAX ``size=-1``) is refused.
- :func:`members` yields the members in stream order and forgets each: no list of them.
- :func:`chunks` reads a member's data in pieces of at most :data:`CHUNK` bytes.
- :class:`Hashed` gives the sha256 of the whole file in the same pass.
- :func:`tail` reads to the end of the gzip stream (checking its CRC) and refuses more
  than :data:`TAIL_BYTES` after the end of the archive, decompressed or not (gzip reads
  zero padding and empty members after its stream one byte per call).

Every fault of the archive, including any error of gzip, zlib or tarfile on hostile
bytes, is a :class:`TarRejected` with its reason.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from registry.core.errors import short, shown, why

CHUNK = 2**20  # members are read, hashed and staged in pieces of this size
TAIL_BYTES = 2**20  # zero records a tar writer may pad its archive with after the end marker
MAX_PAX_DIGITS = 100  # real records hold numbers of at most ~20 digits
_LONG_DIGITS = re.compile(rb"\d{%d}" % (MAX_PAX_DIGITS + 1))  # linear, unlike tarfile's regex
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class TarRejected(Exception):
    """The archive is unreadable or exceeds a limit; ``reason`` says which and where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Hashed:
    """The raw archive file, hashed as gzip reads it: the file's sha256 in the same pass."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw, self._sha = raw, hashlib.sha256()
        self._limit, self._left = 0, -1  # from end_within: bytes it allows, and still left

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size if 0 <= size <= CHUNK else CHUNK)
        if self._left >= 0:
            self._left -= len(data)
            if self._left < 0:
                raise TarRejected(
                    f"more than {self._limit} compressed bytes follow the end of "
                    "the archive (zero padding or empty gzip members)"
                )
        self._sha.update(data)
        return data

    def end_within(self, limit: int) -> None:
        """Refuse to read more than ``limit`` bytes beyond those read so far."""
        self._limit, self._left = limit, limit

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
        self._pax_next = False  # the last read was the header block of PAX records

    def read(self, size: int = -1) -> bytes:
        if size < 0 or self.used + size > self.limit:
            raise TarRejected(
                f"{self._which()} has more than {self.used + max(size, 0)} bytes of tar "
                f"headers (GNU long name, PAX or sparse records); limit {self.limit}"
            )
        self.used += size
        data = self.gz.read(size)
        if self._pax_next and _LONG_DIGITS.search(data):  # tarfile's regex parses it next
            raise TarRejected(
                f"{self._which()} has a PAX record with a run of more than "
                f"{MAX_PAX_DIGITS} digits; limit {MAX_PAX_DIGITS}"
            )
        # tarfile reads each header block on its own, then a PAX header's records at once
        self._pax_next = size == tarfile.BLOCKSIZE and data[156:157] in _PAX_TYPES
        return data

    def _which(self) -> str:
        return f"the member after {short(shown(self.after))}" if self.after else "the first member"

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
                raise TarRejected(f"member {short(shown(info.name))} follows a PAX global header")
            if info.size < 0:  # a base-256 size field or a PAX size=-1; read(-1) reads all
                raise TarRejected(
                    f"member {short(shown(info.name))} has a negative size ({info.size})"
                )
            headers.after = info.name
            yield info
            headers.used = 0
    except TarRejected:
        raise
    except Exception as e:  # any failure of gzip, zlib or tarfile on hostile bytes
        raise TarRejected(f"not a readable tar.gz archive ({why(e)})") from None


def chunks(gz: gzip.GzipFile, name: str, size: int) -> Iterator[bytes]:
    """A member's ``size`` bytes of data, in pieces of at most :data:`CHUNK`."""
    if size < 0:
        raise TarRejected(f"member {short(shown(name))} has a negative size ({size})")
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


def tail(gz: gzip.GzipFile, hashed: Hashed, *, limit: int = TAIL_BYTES) -> None:
    """Read to the end of the gzip stream, which checks its CRC; refuse a long tail, of
    decompressed bytes or of ``hashed``'s (the file gzip reads)."""
    hashed.end_within(limit)
    try:
        rest = gz.read(limit + 1)
    except TarRejected:
        raise
    except Exception as e:
        raise TarRejected(f"not a readable tar.gz archive ({why(e)})") from None
    if len(rest) > limit:
        raise TarRejected(f"more than {limit} bytes follow the end of the archive")
