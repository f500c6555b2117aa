"""Triton's compile cache on the remote tier: the files of ``TRITON_CACHE_DIR`` (compiled
kernels, their groups, autotune results, launcher stubs) shared by every pod, so a
process whose local cache misses loads what another pod compiled instead of compiling.

Keys::

    triton-warmup:triton:<cache key>:<file name>   "<sha256> <size>" of the file's bytes
    triton-warmup:blob:<sha256>                    the bytes (shared with compiled models)

``<cache key>`` is the name of the file's folder in ``TRITON_CACHE_DIR``: Triton's hash of
the source, the compiler, its options, the target and the environment knobs that change
code, so no fingerprint of ours is needed and no path enters it. A file is stored once
by content: N pods publishing the same kernel write its blob once (``SET NX``) and its
name the same value. The blob goes before its name, in one pipeline (one call for a
blob over ``blobs.CHUNK_BYTES``, moved in chunks: :mod:`registry.remote.blobs`), so a
name never points at a blob not yet written; a name whose blob is gone (evicted) or
whose bytes do not hash to it reads as a miss, and the next publish points it at a blob
again. Values are read only within their limits (a name within :data:`POINTER_BYTES`,
a blob within the size its name gives; ``registry.core.redis_url``), each kind by one
function (:func:`read_pointers`, :func:`write_file` here, ``blobs.read_blobs`` and
``blobs.read_into``), and every call ends within the tier's deadline (plus the time
its bytes take). Triton hands a file over, and takes it back, as bytes: a file is in
memory whole, up to :data:`MAX_FILE_BYTES`.
A name's pointer is signed by the publishing pod (:mod:`registry.trust.remote_signature`, over
the name and the pointer); with trusted keys configured a pointer that is unsigned or
not signed by a trusted key is refused (one warning naming the key), and the blob it
names is read only to be checked against the pointer's sha256: a writer to redis
without a key cannot hand a cubin to a pod.
Nothing here raises: a failure is an outage of the tier
(:class:`registry.remote.tier.RemoteTier`), and the caller compiles.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from registry.caches.triton_cache import MAX_GROUP_BYTES
from registry.core import atomic, redis_url
from registry.core.patterns import TRITON_CACHE_KEY
from registry.remote import blobs
from registry.remote.blobs import blob_key, read_blobs
from registry.remote.models import batches
from registry.remote.tier import RemoteTier, scan_names
from registry.trust import remote_signature

log = logging.getLogger(__name__)

NAME_PREFIX = "triton-warmup:triton:"
MAX_FILE_BYTES = 64 * 2**20  # one cache file: a kernel's cubin is KiBs to a few MiB
POINTER_BYTES = 128  # a name's value: "<sha256> <size>"
_FILE = re.compile(r"[^/\\\x00]{1,255}")
_POINTER = re.compile(rb"([0-9a-f]{64}) ([0-9]{1,12})")


def name_key(cache_key: str, filename: str) -> str:
    """The key of the file ``filename`` of the cache folder ``cache_key``."""
    return f"{NAME_PREFIX}{cache_key}:{filename}"


HOST_CODE = (".so", ".dll", ".dylib", ".pyd")  # what the host loads and runs: never shared


def valid(cache_key: object, filename: object) -> bool:
    """Whether a cache folder and file name can be a key: strings, no path, no separator,
    and not host code (Triton's launcher stubs are ``.so`` files it imports: one taken
    from the tier would run whatever a writer to redis put there)."""
    return (
        isinstance(cache_key, str)
        and isinstance(filename, str)
        and TRITON_CACHE_KEY.fullmatch(cache_key) is not None
        and _FILE.fullmatch(filename) is not None
        and filename not in (".", "..")
        and not filename.endswith(HOST_CODE)
    )


def fetch(tier: RemoteTier, cache_key: str, filenames: Sequence[str]) -> dict[str, bytes]:
    """The files of ``filenames`` that the tier holds whole, by name; the others (absent,
    evicted, damaged, over :data:`MAX_FILE_BYTES`, the tier down) are left out."""
    names = [f for f in filenames if valid(cache_key, f)]
    names = list(dict.fromkeys(names))
    if not names:
        return {}
    keys = [name_key(cache_key, f) for f in names]
    pointers = tier.call(functools.partial(read_pointers, keys=keys))
    if pointers is None:
        return {}
    wanted: dict[str, tuple[str, int]] = {}
    for filename, key, value in zip(names, keys, pointers, strict=True):
        raw = tier.opened(key, "", value, code=True)
        found = _POINTER.fullmatch(raw) if raw is not None else None
        if found and int(found[2]) <= MAX_FILE_BYTES:
            wanted[filename] = (found[1].decode(), int(found[2]))
    return _blobs(tier, cache_key, wanted)


def _blobs(
    tier: RemoteTier, cache_key: str, wanted: dict[str, tuple[str, int]]
) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    sizes = {filename: size for filename, (_, size) in wanted.items()}
    for filename in [f for f in wanted if blobs.chunked(sizes[f])]:
        sink = io.BytesIO()  # Triton takes a file as bytes: at most MAX_FILE_BYTES
        sha, size = wanted[filename]
        read = functools.partial(blobs.read_into, sha=sha, size=size, sink=sink)
        moved = tier.call(read, deadline_s=tier.deadline_for(size))
        if moved is None:
            return {}  # the tier failed mid-way: nothing half-fetched is used
        if moved.why is None:
            got[filename] = sink.getvalue()
        elif moved.why != blobs.GONE:
            log.warning("remote triton cache: %s/%s is damaged; compiling", cache_key, filename)
    small = [f for f in wanted if not blobs.chunked(sizes[f])]
    for batch in batches(small, sizes):
        limits = [(blob_key(wanted[filename][0]), sizes[filename]) for filename in batch]
        values = tier.call(
            functools.partial(read_blobs, limits=limits),
            deadline_s=tier.deadline_for(sum(size for _, size in limits)),
        )
        if values is None:
            return {}  # the tier failed mid-way: nothing half-fetched is used
        for filename, data in zip(batch, values, strict=True):
            sha, size = wanted[filename]
            if (
                isinstance(data, bytes)
                and len(data) == size
                and hashlib.sha256(data).hexdigest() == sha
            ):
                got[filename] = data
            elif data is not None:
                log.warning("remote triton cache: %s/%s is damaged; compiling", cache_key, filename)
    return got


def publish(tier: RemoteTier, cache_key: str, filename: str, data: bytes) -> bool:
    """Store ``data`` as the file ``filename`` of ``cache_key`` unless the tier has it;
    True when the tier holds the name (now or from before). A file over
    :data:`MAX_FILE_BYTES` or with a name that is no key is refused."""
    if not valid(cache_key, filename):
        log.warning(
            "remote triton cache: not publishing %r/%r: not a cache file name", cache_key, filename
        )
        return False
    if len(data) > MAX_FILE_BYTES:
        log.warning(
            "remote triton cache: not publishing %s/%s: %d bytes; limit %d",
            cache_key,
            filename,
            len(data),
            MAX_FILE_BYTES,
        )
        return False
    if not tier.may_publish(code=True):
        return False
    sha, name = hashlib.sha256(data).hexdigest(), name_key(cache_key, filename)
    pointer = tier.seal(name, "", f"{sha} {len(data)}".encode())
    write = functools.partial(write_file, blob=blob_key(sha), data=data, name=name, pointer=pointer)
    answer = tier.call(write, deadline_s=tier.deadline_for(len(data)))
    if answer is None:
        return False
    tier.sent(name, "", pointer)
    if answer[0]:
        tier.stats.published += 1
    return True


def read_pointers(client: Any, keys: list[str]) -> list[redis_url.Read]:
    """The values of the names ``keys`` (a pointer in its envelope), each unless over
    :data:`POINTER_BYTES` and the envelope."""
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            redis_url.get(pipe, key, POINTER_BYTES + remote_signature.OVERHEAD)
        return [redis_url.answer(reply) for reply in pipe.execute()]


def write_file(client: Any, blob: str, data: bytes, name: str, pointer: bytes) -> list[Any]:
    """Store a file's bytes at ``blob`` (unless there) and its name's ``pointer``: [the
    blob stored now, the pointer's answer]."""
    sha = blob.removeprefix(blobs.BLOB_PREFIX)
    if blobs.chunked(len(data)):  # in chunks, then the name: still the blob first
        moved = blobs.upload(client, sha, len(data), io.BytesIO(data))
        if moved.why is not None:  # our own bytes: no server makes this so
            raise RuntimeError(f"blob {sha[:16]} not stored: {moved.why}")
        return [moved.new, client.set(name, pointer)]
    with client.pipeline(transaction=False) as pipe:
        pipe.set(blob, data, nx=True)  # the blob first: a name never points at nothing
        pipe.set(name, pointer)
        return list(pipe.execute())


def sample_metadata(tier: RemoteTier, limit: int = 200) -> dict[str, bytes]:
    """Up to ``limit`` compiled kernels' metadata files on the tier, by cache key (for
    ``explain``: what the kernels there were compiled for); {} when the tier is down."""
    pattern = f"{NAME_PREFIX}*.json"
    names = tier.call(lambda client: scan_names(client, pattern, limit * 4), now=True) or []
    wanted: dict[str, str] = {}
    for name in names:
        cache_key, _, filename = name.removeprefix(NAME_PREFIX).partition(":")
        if filename.startswith("__grp__") or filename.endswith(".autotune.json"):
            continue
        if valid(cache_key, filename) and len(wanted) < limit:
            wanted.setdefault(cache_key, filename)
    found = {}
    for cache_key, filename in wanted.items():
        data = fetch(tier, cache_key, [filename]).get(filename)
        if data is not None:
            found[cache_key] = data
    return found


def group_value(names: Iterable[str]) -> bytes:
    """A kernel's group as the tier holds it: its files' names only (a path from one
    pod's cache means nothing in another's)."""
    return json.dumps({"child_paths": sorted(names)}).encode()


def group_names(raw: bytes, cache_key: str, metadata: str) -> list[str] | None:
    """The names a group from the tier lists; None for anything that is not a group of
    the kernel whose metadata file is ``metadata`` (too big, not JSON, a name that is a
    path or host code, no metadata file)."""
    if len(raw) > MAX_GROUP_BYTES:
        return None
    try:
        children = atomic.loads(raw)["child_paths"]
    except (ValueError, KeyError, TypeError):
        return None
    names = list(children) if isinstance(children, (list, dict)) else []
    if metadata not in names or not all(valid(cache_key, n) for n in names):
        return None
    return names
