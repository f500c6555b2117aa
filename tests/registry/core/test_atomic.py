"""Bounded reads and copies: the bound holds while the file grows, in small pieces."""

import contextlib
import io
import os
import tracemalloc

import pytest

from registry.core import atomic

MIB = 2**20


@contextlib.contextmanager
def growing(path, by: int):
    """``atomic.open_bounded`` whose file grows by ``by`` bytes right after it is checked."""
    real = atomic.open_bounded

    @contextlib.contextmanager
    def opened(src, limit, **kwargs):
        with real(src, limit, **kwargs) as f:
            with open(path, "ab") as more:
                more.write(b"g" * by)
            yield f

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(atomic, "open_bounded", opened)
        yield


def test_a_copy_keeps_its_bound_while_the_file_grows(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"x" * 10)
    dst.write_bytes(b"old")
    with growing(src, 5 * MIB), pytest.raises(atomic.TooBig, match="over 1048576 bytes"):
        atomic.copy_file(src, dst, limit=MIB)
    assert dst.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "dst",
        "src",
    ]
    with growing(src, 5 * MIB), pytest.raises(atomic.TooBig):
        atomic.read_bounded(src, MIB)
    with pytest.raises(atomic.TooBig, match="limit 100"):  # refused by its size, unread
        atomic.copy_file(src, dst, limit=100)


def test_a_copy_streams_and_keeps_the_mode(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(os.urandom(32 * MIB))
    src.chmod(0o755)
    tracemalloc.start()
    try:
        assert atomic.copy_file(src, dst, limit=64 * MIB, durable=False) == 32 * MIB
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB and dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_mode & 0o777 == 0o755


def test_a_copy_follows_no_link_and_takes_no_fifo(tmp_path):
    (tmp_path / "real").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError):
        atomic.copy_file(tmp_path / "link", tmp_path / "dst", limit=MIB)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        atomic.copy_file(tmp_path / "fifo", tmp_path / "dst", limit=MIB)
    assert not (tmp_path / "dst").exists()


def test_chunks_stop_one_byte_past_the_limit():
    assert b"".join(atomic.chunks(io.BytesIO(b"a" * 10), 10, "f")) == b"a" * 10
    with pytest.raises(atomic.TooBig):
        list(atomic.chunks(io.BytesIO(b"a" * 11), 10, "f"))


def test_a_small_read_allocates_what_the_file_holds_not_the_limit(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    tracemalloc.start()
    try:
        assert atomic.read_bounded(tmp_path / "f", 256 * MIB) == b"abc"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MIB
