"""The streaming tar.gz reader on its own: members in order, data in chunks, limits."""

import gzip
import hashlib
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from registry import tar_stream
from registry.tar_stream import CHUNK, TAIL_BYTES, TarRejected

BLOCK = tarfile.BLOCKSIZE


def _read(path: Path, max_header_bytes: int = 64 * 2**10) -> tuple[dict[str, list[bytes]], str]:
    """Every member's data as the chunks it came in, in stream order; the file's sha256."""
    with path.open("rb") as raw:
        hashed = tar_stream.Hashed(raw)
        gz = gzip.GzipFile(fileobj=hashed, mode="rb")
        data = {
            info.name: list(tar_stream.chunks(gz, info.name, info.size))
            for info in tar_stream.members(gz, max_header_bytes)
        }
        tar_stream.tail(gz)
        return data, hashed.hexdigest()


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _member(name: str, data: bytes) -> bytes:
    """A header block and ``data`` padded to whole blocks."""
    return _header(name, len(data)) + data + bytes(-len(data) % BLOCK)


def test_members_stream_in_order_in_chunks_with_the_whole_file_hashed(tmp_path):
    big = os.urandom(2 * CHUNK + CHUNK // 2)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo("z-first"), io.BytesIO())
        for name, data in [("b/big", big), ("a", b"small")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "a.tgz"
    path.write_bytes(gzip.compress(buffer.getvalue()))
    data, sha = _read(path)
    assert list(data) == ["z-first", "b/big", "a"]
    assert data["z-first"] == [] and data["a"] == [b"small"]
    assert [len(c) for c in data["b/big"]] == [CHUNK, CHUNK, CHUNK // 2]
    assert b"".join(data["b/big"]) == big
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "before,which", [([], "the first member"), (["ok"], "the member after 'ok'")]
)
def test_a_gnu_long_name_over_the_limit_is_refused_before_it_is_read(tmp_path, before, which):
    size = 64 * 2**20  # the archive holds none of it: reading it would fail differently
    pieces = [_member(n, b"x") for n in before] + [_header("././@LongLink", size, b"L")]
    path = tmp_path / "bomb.tgz"
    path.write_bytes(gzip.compress(b"".join(pieces)))
    with pytest.raises(TarRejected) as caught:
        _read(path, max_header_bytes=4096)
    refusal = rf"{re.escape(which)} has more than (\d+) bytes of tar headers \(.*\); limit 4096"
    found = re.fullmatch(refusal, caught.value.reason)
    assert found and int(found[1]) > size, caught.value.reason  # counted, not read


@pytest.mark.parametrize(
    "after_end,expected",
    [
        (bytes(TAIL_BYTES), None),
        (bytes(TAIL_BYTES + 1), f"more than {TAIL_BYTES} bytes follow the end of the archive"),
    ],
)
def test_the_data_after_the_end_marker_is_bounded(tmp_path, after_end, expected):
    end = bytes(BLOCK)  # the zero block tarfile stops at
    path = tmp_path / "a.tgz"
    path.write_bytes(gzip.compress(_member("a", b"x") + end + after_end))
    if expected is None:
        assert _read(path)[0] == {"a": [b"x"]}
    else:
        with pytest.raises(TarRejected, match=expected):
            _read(path)


@pytest.mark.parametrize(
    "content,expected",
    [
        (lambda good: b"not gzip", r"not a readable tar\.gz archive \(BadGzipFile: "),
        (lambda good: good + b"garbage!", r"not a readable tar\.gz archive \(BadGzipFile: "),
        (lambda good: good[:-9], r"not a readable tar\.gz archive \(EOFError: "),
        (
            lambda good: gzip.compress(_header("a", 3 * BLOCK) + b"y" * 10),
            r"^member 'a' ends after 10 of 1536 bytes$",
        ),
    ],
)
def test_a_broken_archive_is_a_tar_rejected_with_its_reason(tmp_path, content, expected):
    good = gzip.compress(_member("a", b"x") + bytes(2 * BLOCK))
    path = tmp_path / "a.tgz"
    path.write_bytes(content(good))
    with pytest.raises(TarRejected, match=expected):
        _read(path)
