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
name the same value. The blob goes before its name in one pipeline, so a name never
points at a blob not yet written; a name whose blob is gone (evicted) or whose bytes do
not hash to it reads as a miss, and the next publish points it at a blob again.
Nothing here raises: a failure is an outage of the tier
(:class:`registry.remote.RemoteTier`), and the caller compiles.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from registry.remote import RemoteTier
from registry.remote_models import BATCH_BYTES, BATCH_KEYS, blob_key

log = logging.getLogger(__name__)

NAME_PREFIX = "triton-warmup:triton:"
MAX_FILE_BYTES = 64 * 2**20  # one cache file: a kernel's cubin is KiBs to a few MiB
_KEY = re.compile(r"[A-Za-z0-9_=-]{1,128}")  # Triton's base32 hash, or a hex one
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
        and _KEY.fullmatch(cache_key) is not None
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
    pointers = tier.call(_getter([name_key(cache_key, f) for f in names]))
    if pointers is None:
        return {}
    wanted: dict[str, tuple[str, int]] = {}
    for filename, raw in zip(names, pointers, strict=True):
        found = _POINTER.fullmatch(raw) if raw is not None else None
        if found and int(found[2]) <= MAX_FILE_BYTES:
            wanted[filename] = (found[1].decode(), int(found[2]))
    return _blobs(tier, cache_key, wanted)


def _blobs(
    tier: RemoteTier, cache_key: str, wanted: dict[str, tuple[str, int]]
) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    for batch in _batches(list(wanted.items())):
        values = tier.call(_getter([blob_key(sha) for _, (sha, _) in batch]))
        if values is None:
            return {}  # the tier failed mid-way: nothing half-fetched is used
        for (filename, (sha, size)), data in zip(batch, values, strict=True):
            if data is not None and len(data) == size and hashlib.sha256(data).hexdigest() == sha:
                got[filename] = data
            elif data is not None:
                log.warning("remote triton cache: %s/%s is damaged; compiling", cache_key, filename)
    return got


def _batches(items: list[tuple[str, tuple[str, int]]]) -> list[list[tuple[str, tuple[str, int]]]]:
    """Blobs in batches of at most :data:`BATCH_BYTES` and :data:`BATCH_KEYS`, by size."""
    batches: list[list[tuple[str, tuple[str, int]]]] = [[]]
    held = 0
    for item in items:
        size = item[1][1]
        if batches[-1] and (held + size > BATCH_BYTES or len(batches[-1]) >= BATCH_KEYS):
            batches.append([])
            held = 0
        batches[-1].append(item)
        held += size
    return [batch for batch in batches if batch]


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
    sha = hashlib.sha256(data).hexdigest()
    pointer = f"{sha} {len(data)}".encode()
    answer = tier.call(_writer(blob_key(sha), data, name_key(cache_key, filename), pointer))
    if answer is None:
        return False
    if answer[0]:
        tier.stats.published += 1
    return True


def _writer(blob: str, data: bytes, name: str, pointer: bytes) -> Callable[[Any], list[Any]]:
    def write(client: Any) -> list[Any]:
        with client.pipeline(transaction=False) as pipe:
            pipe.set(blob, data, nx=True)  # the blob first: a name never points at nothing
            pipe.set(name, pointer)
            return list(pipe.execute())

    return write


def _getter(keys: list[str]) -> Callable[[Any], list[bytes | None]]:
    return lambda client: list(client.mget(keys))


def sample_metadata(tier: RemoteTier, limit: int = 200) -> dict[str, bytes]:
    """Up to ``limit`` compiled kernels' metadata files on the tier, by cache key (for
    ``explain``: what the kernels there were compiled for); {} when the tier is down."""
    names = tier.call(_scan(f"{NAME_PREFIX}*.json", limit * 4), now=True) or []
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


def _scan(pattern: str, limit: int) -> Callable[[Any], list[str]]:
    """Up to ``limit`` key names matching ``pattern`` (SCAN: never blocks the server)."""

    def scan(client: Any) -> list[str]:
        names: list[str] = []
        for name in client.scan_iter(match=pattern, count=1000):
            names.append(name.decode(errors="replace") if isinstance(name, bytes) else name)
            if len(names) >= limit:
                break
        return names

    return scan
