"""Raw tar blocks that ``tarfile`` will not write, for the tests (and benches) of the
streaming bundle reader: headers of any type and size, PAX records, negative sizes."""

from __future__ import annotations

import tarfile

BLOCK = tarfile.BLOCKSIZE


def header(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One GNU-format header block of ``kind`` announcing ``size`` bytes."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def pax(*records: bytes, kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A PAX header block of ``kind`` and its records (``b"key=value"``), padded."""
    payload = b""
    for record in records:
        body = b" " + record + b"\n"
        length = len(body) + 1
        while length != len(body) + len(str(length)):  # the length counts its own digits
            length = len(body) + len(str(length))
        payload += str(length).encode() + body
    return header("pax", len(payload), kind) + payload + bytes(-len(payload) % BLOCK)


def negative_size(name: str) -> bytes:
    """A header block whose base-256 size field is -1 (tarfile reads it as -1)."""
    block = bytearray(header(name, 0))
    block[124:136] = b"\xff" * 12
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % sum(block)
    return bytes(block)
