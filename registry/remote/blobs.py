"""Blobs on the remote tier: a file's bytes at ``triton-warmup:blob:<sha256>``, shared by
compiled models (:mod:`registry.remote.models`) and Triton's cache
(:mod:`registry.remote.triton`), moved in bounded chunks.

Layout: a blob is one string at its key, as every version wrote and read it, so pods
of older versions read what this one writes, and the other way round. A blob of at
most :data:`CHUNK_BYTES` moves as it always did: read with others in one round trip
(:func:`read_blobs`), written with one ``SET NX``. A larger one moves in chunks of
:data:`CHUNK_BYTES`:

- read by :func:`read_into`: ``GETRANGE`` a chunk at a time, each in one atomic step
  with a check that the server still holds the size expected, into the caller's sink
  (a temp file beside the target), hashed as it comes; the caller keeps it only when
  it hashes to its name.
- written by :func:`upload`: an upload key of its own,
  ``triton-warmup:upload:<sha256>:<random>``, is made at the blob's size at once (so
  the server never grows it chunk by chunk, which copies it again at each append), then
  each chunk written in place (``SETRANGE``; each write checks that the key still holds
  that size, and renews a :data:`UPLOAD_TTL_S` expiry), then renamed onto the blob's key
  (``RENAME``) once all were sent and they hashed to its name, unless a blob is there.
  A reader never sees half a blob, and a publish killed mid-way leaves only its upload
  key (the blob's size, zeros where nothing came), which no reader asks for and which
  expires.

So memory is a few chunks whatever the blob's size. The caller gives the whole move one
deadline (``RemoteTier.deadline_for``: the tier's timeout plus the blob's bytes at the
stated rate), within which every wait on the socket gets all the time left
(``registry.core.redis_url``). Nothing here retries.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from registry.core import redis_url

BLOB_PREFIX = "triton-warmup:blob:"
UPLOAD_PREFIX = "triton-warmup:upload:"
CHUNK_BYTES = 4 * 2**20  # one round trip's bytes: memory is a few of them, any blob
UPLOAD_TTL_S = 60  # an upload key's life after its last append (a killed publish's)
GONE = "the server holds none (evicted?)"  # why a blob did not move, the commonest

# The chunk ARGV[2]..ARGV[3] of KEYS[1] while it holds ARGV[1] bytes: {length, bytes};
# {length} (0: none) when it holds another size.
_RANGE = """
local n = redis.call('strlen', KEYS[1])
if n ~= tonumber(ARGV[1]) then return {n} end
return {n, redis.call('getrange', KEYS[1], ARGV[2], ARGV[3])}
"""
# Make KEYS[1] ARGV[1] bytes long (zeros), living ARGV[2] seconds: 1; -1 when it exists.
_START = """
if redis.call('exists', KEYS[1]) == 1 then return -1 end
redis.call('setrange', KEYS[1], tonumber(ARGV[1]) - 1, '\\0')
redis.call('expire', KEYS[1], ARGV[2])
return 1
"""
# Write ARGV[3] at ARGV[2] into KEYS[1] if it holds ARGV[1] bytes, and let it live ARGV[4]
# seconds more: 1; -1 when it holds another length (evicted or expired meanwhile).
_WRITE = """
if redis.call('strlen', KEYS[1]) ~= tonumber(ARGV[1]) then return -1 end
redis.call('setrange', KEYS[1], ARGV[2], ARGV[3])
redis.call('expire', KEYS[1], ARGV[4])
return 1
"""
# Move the upload KEYS[1] onto the blob KEYS[2] if it holds ARGV[1] bytes and no blob is
# there: 1 moved; 0 a blob there (the upload deleted); -1 another length (deleted).
_COMMIT = """
if redis.call('strlen', KEYS[1]) ~= tonumber(ARGV[1]) then
  redis.call('del', KEYS[1])
  return -1
end
if redis.call('exists', KEYS[2]) == 1 then
  redis.call('del', KEYS[1])
  return 0
end
redis.call('rename', KEYS[1], KEYS[2])
return 1
"""


def blob_key(sha: str) -> str:
    """The key of the blob whose bytes hash to ``sha``."""
    return f"{BLOB_PREFIX}{sha}"


def chunked(size: int) -> bool:
    """Whether a blob of ``size`` bytes moves in chunks (:func:`read_into`, :func:`upload`)
    rather than whole with others (:func:`read_blobs`)."""
    return size > CHUNK_BYTES


@dataclass(frozen=True)
class Moved:
    """What moving one blob came to: ``why`` it did not move (None: it did), and for an
    upload whether it was stored now (``new``; False: the server held it already)."""

    why: str | None = None
    new: bool = False


def read_blobs(client: Any, limits: Sequence[tuple[str, int]]) -> list[redis_url.Read]:
    """The blobs at the keys of ``limits``, each unless over its limit (one round trip)."""
    with client.pipeline(transaction=False) as pipe:
        for key, limit in limits:
            redis_url.get(pipe, key, limit)
        return [redis_url.answer(reply) for reply in pipe.execute()]


def read_into(client: Any, sha: str, size: int, sink: BinaryIO) -> Moved:
    """Write the blob ``sha`` of ``size`` bytes into ``sink`` a chunk at a time, hashing
    it as it comes; ``why`` not when the server holds none or another size (never read
    past ``size``), its bytes are not those of its name, or ``sink`` fails (OSError: the
    volume, not the server). Redis errors raise (an outage, for the caller's call)."""
    digest, key = hashlib.sha256(), blob_key(sha)
    for start in range(0, size, CHUNK_BYTES):
        end = min(start + CHUNK_BYTES, size)
        reply = client.eval(_RANGE, 1, key, size, start, end - 1)
        held = int(reply[0])
        if len(reply) < 2:
            return Moved(GONE if held == 0 else f"the server holds {held} bytes")
        piece: bytes = reply[1]
        if len(piece) != end - start:  # no server answers so; never written on
            return Moved(f"the server sent {len(piece)} bytes at {start}")
        digest.update(piece)
        try:
            sink.write(piece)
        except OSError as e:
            return Moved(f"not written here: {e}")
        del reply, piece  # not held while the next chunk comes
    if digest.hexdigest() != sha:
        return Moved("not the bytes of its name")
    return Moved()


def upload(client: Any, sha: str, size: int, source: BinaryIO) -> Moved:
    """Store the ``size`` bytes that ``source`` has left as the blob ``sha``, unless the
    server holds it: in one ``SET NX`` up to :data:`CHUNK_BYTES`, else a chunk at a time
    through an upload key (see the module). ``why`` not when ``source`` holds other
    bytes than ``sha``'s (fewer, more, others) or cannot be read (OSError): nothing is
    stored then. Redis errors raise (an outage, for the caller's call)."""
    if not chunked(size):
        try:
            data = source.read(size + 1)
        except OSError as e:
            return Moved(f"not read: {e}")
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            return Moved("not the bytes of its name")
        return Moved(new=bool(client.set(blob_key(sha), data, nx=True)))
    temp = f"{UPLOAD_PREFIX}{sha}:{secrets.token_hex(8)}"
    if int(client.eval(_START, 1, temp, size, UPLOAD_TTL_S)) < 0:
        return Moved("its upload key is taken")  # 64 random bits: never by chance
    why = _write_all(client, temp, sha, size, source)
    if why is not None:
        client.delete(temp)  # within the call: an error before it leaves it to expire
        return Moved(why)
    stored = int(client.eval(_COMMIT, 2, temp, blob_key(sha), size))
    if stored < 0:
        return Moved("the upload key changed under it (evicted?)")
    return Moved(new=stored == 1)


def _write_all(client: Any, temp: str, sha: str, size: int, source: BinaryIO) -> str | None:
    """Write ``source``'s ``size`` bytes into ``temp`` a chunk at a time: why not, or None."""
    digest, sent = hashlib.sha256(), 0
    while sent < size:
        try:
            piece = source.read(min(CHUNK_BYTES, size - sent))
        except OSError as e:
            return f"not read: {e}"
        if not piece:
            return f"{sent} bytes; its name gives {size}"
        digest.update(piece)
        if int(client.eval(_WRITE, 1, temp, size, sent, piece, UPLOAD_TTL_S)) < 0:
            return "the upload key changed under it (evicted?)"
        sent += len(piece)
        del piece  # not held while the next chunk is read
    try:
        more = source.read(1)
    except OSError as e:
        return f"not read: {e}"
    if more or digest.hexdigest() != sha:
        return "not the bytes of its name"
    return None
