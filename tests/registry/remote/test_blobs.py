"""Blobs on the remote tier in chunks (``registry.remote.blobs``, a real redis-server): a
blob of several chunks round-trips in the layout older pods read, never whole in
memory; bytes that are not their name's are refused; a killed publish leaves nothing
a reader takes as a blob; a busy server within the rate is waited for, a slower one is
cut at the call's deadline."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc

import pytest

from registry.core import redis_url
from registry.remote import blobs, transport
from registry.remote.blobs import Moved, blob_key
from registry.remote.tier import RemoteTier
from tests.registry._trickle import throttled, within

CHUNK = 256 * 2**10  # the tests' chunk: a blob of a few MiB is many of them


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(blobs, "CHUNK_BYTES", CHUNK)


def _blob(size: int) -> tuple[bytes, str]:
    data = os.urandom(size)
    return data, hashlib.sha256(data).hexdigest()


def _client(url: str):
    return redis_url.client(url, timeout_s=1.0)


def test_a_blob_of_several_chunks_round_trips_as_one_value(server, small_chunks):
    data, sha = _blob(5 * CHUNK + 7)
    client = _client(server.url)
    assert blobs.upload(client, sha, len(data), io.BytesIO(data)) == Moved(new=True)
    assert server.client.get(blob_key(sha)) == data  # one string: what older pods read
    assert not server.client.keys(f"{blobs.UPLOAD_PREFIX}*")
    sink = io.BytesIO()
    assert blobs.read_into(client, sha, len(data), sink) == Moved()
    assert sink.getvalue() == data
    assert blobs.upload(client, sha, len(data), io.BytesIO(data)) == Moved(new=False)


def test_a_blob_an_older_pod_wrote_is_read_in_chunks(server, small_chunks):
    data, sha = _blob(3 * CHUNK)
    server.client.set(blob_key(sha), data)  # one SET, as older versions published it
    sink = io.BytesIO()
    assert blobs.read_into(_client(server.url), sha, len(data), sink) == Moved()
    assert sink.getvalue() == data


def test_bytes_that_are_not_their_name_are_refused(server, small_chunks):
    data, sha = _blob(3 * CHUNK)
    client = _client(server.url)
    server.client.set(blob_key(sha), os.urandom(len(data)))  # the right size, other bytes
    moved = blobs.read_into(client, sha, len(data), io.BytesIO())
    assert moved.why == "not the bytes of its name"
    server.client.delete(blob_key(sha))
    assert blobs.read_into(client, sha, len(data), io.BytesIO()).why == blobs.GONE


def test_a_source_that_is_not_its_name_stores_nothing(server, small_chunks):
    data, sha = _blob(3 * CHUNK)
    client = _client(server.url)
    for source in (os.urandom(len(data)), data[:-1], data + b"!"):
        moved = blobs.upload(client, sha, len(data), io.BytesIO(source))
        assert moved.why is not None
    _, small_sha = _blob(100)
    assert blobs.upload(client, small_sha, 100, io.BytesIO(b"x" * 100)).why is not None
    assert not server.client.keys("*")  # neither a blob nor an upload key


def test_a_blob_held_at_another_size_is_never_read(server, small_chunks):
    data, sha = _blob(3 * CHUNK)
    server.client.setrange(blob_key(sha), 32 * 2**20 - 1, b"!")  # 32 MiB, a few bytes sent
    tracemalloc.start()
    try:
        moved = blobs.read_into(_client(server.url), sha, len(data), io.BytesIO())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert moved.why == f"the server holds {32 * 2**20} bytes" and peak < 2**20, peak


def test_memory_stays_a_few_chunks_whatever_the_size(server, tmp_path):
    size = 10 * blobs.CHUNK_BYTES  # 40 MiB, real chunks
    source = tmp_path / "blob"
    digest = hashlib.sha256()
    with source.open("wb") as f:
        for _ in range(10):
            piece = os.urandom(blobs.CHUNK_BYTES)
            digest.update(piece)
            f.write(piece)
    sha, client = digest.hexdigest(), _client(server.url)
    tracemalloc.start()
    try:
        with redis_url.deadline(30.0), source.open("rb") as f:
            assert blobs.upload(client, sha, size, f) == Moved(new=True)
        up = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        with redis_url.deadline(30.0), (tmp_path / "back").open("wb") as out:
            assert blobs.read_into(client, sha, size, out) == Moved()
        down = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert max(up, down) < 5 * blobs.CHUNK_BYTES, (up, down)  # of 10: never whole
    assert (tmp_path / "back").read_bytes() == source.read_bytes()


# ---- a publish killed mid-way -----------------------------------------------------------

_PUBLISHER = """
import hashlib, io, sys
from registry.core import redis_url
from registry.remote import blobs
blobs.CHUNK_BYTES = {chunk}
data = bytes(range(256)) * ({size} // 256)
client = redis_url.client({url!r}, timeout_s=1.0)
with redis_url.deadline(600):
    blobs.upload(client, hashlib.sha256(data).hexdigest(), len(data), io.BytesIO(data))
"""


def test_a_killed_publish_leaves_nothing_a_reader_takes_as_a_blob(server):
    size = 16 * CHUNK
    data = bytes(range(256)) * (size // 256)
    sha = hashlib.sha256(data).hexdigest()
    with throttled(server.port, up_bytes_per_s=CHUNK) as url:  # 16 s to send it all
        code = textwrap.dedent(_PUBLISHER.format(chunk=CHUNK, size=size, url=url))
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        try:
            deadline = time.monotonic() + 30
            while not _written(server.client, 2 * CHUNK - 1):  # mid-way: two chunks there
                assert child.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    assert not server.client.exists(blob_key(sha))
    (upload,) = server.client.keys(f"{blobs.UPLOAD_PREFIX}{sha}:*")
    assert 0 < server.client.ttl(upload) <= blobs.UPLOAD_TTL_S  # it expires
    assert blobs.read_into(_client(server.url), sha, size, io.BytesIO()).why is not None


def _written(client, offset: int) -> bool:
    """Whether an upload key holds the publisher's byte at ``offset`` (255 there), not
    the zero it is made with."""
    keys = client.keys(f"{blobs.UPLOAD_PREFIX}*")
    return any(client.getrange(key, offset, offset) == b"\xff" for key in keys)


# ---- the deadline: the blob's bytes at the stated rate ----------------------------------

RATE = CHUNK  # the tests' stated rate (transport.MIN_BYTES_PER_S): a chunk a second


@pytest.fixture
def slow_rate(monkeypatch, small_chunks):
    monkeypatch.setattr(transport, "MIN_BYTES_PER_S", RATE)


def _moved_through(url: str, sha: str, size: int, move) -> tuple[Moved | None, RemoteTier]:
    tier = RemoteTier(url, timeout_s=0.2, retry_after_s=30.0)
    moved = tier.call(
        functools.partial(move, sha=sha, size=size), deadline_s=tier.deadline_for(size)
    )
    return moved, tier


def test_a_busy_server_within_the_rate_is_waited_for_past_a_second(server, slow_rate):
    data, sha = _blob(4 * CHUNK)  # deadline 0.2 + 4 s; each answer comes after 0.3 s
    sink, took = io.BytesIO(), []
    with throttled(server.port, stall_s=0.3) as url:
        for move in (_upload_from(data), _read_into(sink)):
            started = time.monotonic()
            moved, tier = _moved_through(url, sha, len(data), move)
            took.append(time.monotonic() - started)
            assert moved is not None and moved.why is None and tier.stats.errors == 0
    assert sink.getvalue() == data
    assert min(took) > 1.0, took  # each call past a second, each wait past timeout_s


def test_a_server_slower_than_the_rate_is_cut_at_the_deadline(server, slow_rate):
    data, sha = _blob(2 * CHUNK)  # deadline 2.2 s; at half the rate it needs 4 s
    with throttled(server.port, up_bytes_per_s=RATE / 2) as url, within(2.2 + 0.5):
        up, tier = _moved_through(url, sha, len(data), _upload_from(data))
    assert up is None and tier.stats.errors == 1 and not tier.up  # an outage, as any
    assert not server.client.exists(blob_key(sha))
    server.client.set(blob_key(sha), data)
    with throttled(server.port, down_bytes_per_s=RATE / 2) as url, within(2.2 + 0.5):
        down, tier = _moved_through(url, sha, len(data), _read_into(io.BytesIO()))
    assert down is None and tier.stats.errors == 1


def _upload_from(data: bytes):
    return lambda client, sha, size: blobs.upload(client, sha, size, io.BytesIO(data))


def _read_into(sink: io.BytesIO):
    return lambda client, sha, size: blobs.read_into(client, sha, size, sink)
