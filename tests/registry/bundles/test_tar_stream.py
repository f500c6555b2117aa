"""The streaming tar.gz reader on its own: members in order, data in chunks, limits."""

import gzip
import hashlib
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from registry.bundles import tar_stream
from registry.bundles.tar_stream import CHUNK, TAIL_BYTES, TarRejected
from tests.tar_blocks import header, negative_size, pax

BLOCK = tarfile.BLOCKSIZE


def _read(
    path: Path, max_header_bytes: int = 64 * 2**10, tail_limit: int = TAIL_BYTES
) -> tuple[dict[str, list[bytes]], str]:
    """Every member's data as the chunks it came in, in stream order; the file's sha256."""
    with path.open("rb") as raw:
        hashed = tar_stream.Hashed(raw)
        gz = gzip.GzipFile(fileobj=hashed, mode="rb")
        data = {
            info.name: list(tar_stream.chunks(gz, info.name, info.size))
            for info in tar_stream.members(gz, max_header_bytes)
        }
        tar_stream.tail(gz, hashed, limit=tail_limit)
        return data, hashed.hexdigest()


def _member(name: str, data: bytes) -> bytes:
    """A header block and ``data`` padded to whole blocks."""
    return header(name, len(data)) + data + bytes(-len(data) % BLOCK)


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
    pieces = [_member(n, b"x") for n in before] + [header("././@LongLink", size, b"L")]
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
            lambda good: gzip.compress(header("a", 3 * BLOCK) + b"y" * 10),
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


@pytest.mark.parametrize(
    "head",
    [negative_size("a"), pax(b"size=-1") + header("a", 0)],
    ids=["base-256", "pax"],
)
def test_a_negative_member_size_is_refused_before_any_data_is_read(tmp_path, head):
    path = tmp_path / "neg.tgz"
    path.write_bytes(gzip.compress(head + bytes(4 * CHUNK)))  # read(-1) would take it all
    with pytest.raises(TarRejected, match=r"^member 'a' has a negative size \(-1\)$"):
        _read(path)


def test_chunks_refuses_a_negative_size(tmp_path):
    path = tmp_path / "a.gz"
    path.write_bytes(gzip.compress(bytes(3 * CHUNK)))
    with gzip.open(path, "rb") as gz:
        with pytest.raises(TarRejected, match=r"member 'a' has a negative size \(-1\)"):
            next(tar_stream.chunks(gz, "a", -1))
        assert gz.tell() == 0


def test_a_pax_record_with_a_long_run_of_digits_is_refused_before_tarfile_parses_it(tmp_path):
    # CVE-2024-6232: tarfile before 3.11.10 / 3.12.6 scans such a run in quadratic time.
    ok = pax(b"comment=" + b"7" * tar_stream.MAX_PAX_DIGITS) + _member("ok", b"x")
    bad = pax(b"comment=" + b"7" * (tar_stream.MAX_PAX_DIGITS + 1)) + _member("bad", b"x")
    path = tmp_path / "redos.tgz"
    path.write_bytes(gzip.compress(ok + bad))
    with pytest.raises(TarRejected) as caught:
        _read(path)
    assert caught.value.reason == (
        "the member after 'ok' has a PAX record with a run of more than "
        f"{tar_stream.MAX_PAX_DIGITS} digits; limit {tar_stream.MAX_PAX_DIGITS}"
    )


def test_digits_outside_pax_records_are_not_limited(tmp_path):
    long_name = "d/" + "1" * 200  # a GNU long name: tarfile parses it without a regex
    with tarfile.open(fileobj=(buffer := io.BytesIO()), mode="w", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo(long_name)
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    path = tmp_path / "a.tgz"
    path.write_bytes(gzip.compress(buffer.getvalue()))
    assert _read(path)[0] == {long_name: [b"x"]}


def test_a_name_in_a_refusal_is_cut_short_and_quoted(tmp_path):
    name = "x\n" * 3000  # unchecked: tar_stream refuses before the caller sees the name
    global_header = pax(b"comment=x", kind=tarfile.XGLTYPE)
    with tarfile.open(fileobj=(buffer := io.BytesIO()), mode="w", format=tarfile.PAX_FORMAT) as t:
        t.addfile(tarfile.TarInfo(name))
    path = tmp_path / "a.tgz"
    path.write_bytes(gzip.compress(global_header + buffer.getvalue()))
    with pytest.raises(TarRejected) as caught:
        _read(path)
    reason = caught.value.reason
    assert "\n" not in reason and len(reason) < 200 and "follows a PAX global header" in reason


@pytest.mark.parametrize("trailer", ["zeros", "empty gzip members"])
def test_the_compressed_bytes_after_the_end_marker_are_bounded(tmp_path, trailer):
    limit = 16 * 2**10
    good = gzip.compress(_member("a", b"x") + bytes(2 * BLOCK))
    padding = bytes(64 * 2**10) if trailer == "zeros" else gzip.compress(b"") * 4000
    path = tmp_path / "a.tgz"
    path.write_bytes(good + bytes(limit // 2))  # a little zero padding is fine
    assert _read(path, tail_limit=limit)[0] == {"a": [b"x"]}
    path.write_bytes(good + padding)  # gzip reads zero padding one byte a call
    with pytest.raises(TarRejected, match=f"more than {limit} compressed bytes follow the end"):
        _read(path, tail_limit=limit)
