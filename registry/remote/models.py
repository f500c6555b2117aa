"""Compiled models on the remote tier: the family of :mod:`registry.caches.inductor_cache` on
the same redis server as the tuned entries, so a pod on any node restores a model that
another node compiled, with no shared volume.

Keys::

    triton-warmup:model:<model>:<fingerprint digest[:32]>:<key digest>   an index's JSON
    triton-warmup:blob:<sha256>                                          a file's bytes

An index is published as the volume holds it, plus ``modes`` (sha256 -> file mode: a
compiled kernel's ``.so`` keeps its bits). Blobs go first, each only if the server lacks
it, then the index: a reader that finds an index finds its blobs, unless the server
evicted one, which reads as a miss. An index is signed by the publishing pod
(:mod:`registry.trust.remote_signature`); with trusted keys configured one unsigned or not
signed by a trusted key is refused before it is parsed, and the blobs it names are
checked against it. Nothing read is trusted: an index must parse
(``parse_index``), name this model, key and fingerprint, and stay within the family's
limits; a blob must hash to its name. Every value is read only once the server found it
within its limit (an index within :data:`MAX_VALUE_BYTES`, a blob within the size its
index gives: ``registry.core.redis_url``), and each kind is read and written by one function
(:func:`read_index`, :func:`write_index` here; blobs in :mod:`registry.remote.blobs`).
Blobs up to ``blobs.CHUNK_BYTES`` move in batches, larger ones one at a time in chunks:
fetched into a temp file beside their place in the volume, hashed as they come, renamed
when they hash to their name; published from the file a chunk at a time (never a blob
whole in memory). Each call ends within the tier's deadline, plus the time its bytes
take (``RemoteTier.deadline_for``: a large blob's call is the whole blob). Fetched blobs
and index are written into the volume's family (blobs first, each atomically); the
caller then restores from there as from any volume. Both calls are made even while the
tier is skipped after a failure: one round of calls against minutes of compiling.
Neither raises.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from registry.caches import inductor_cache
from registry.caches.inductor_cache import (
    MAX_FILE_BYTES,
    MAX_INDEX_BYTES,
    MAX_INDEX_VALUES,
    MAX_MODEL_BYTES,
    blob_path,
    index_path,
)
from registry.core import atomic, redis_url
from registry.core.errors import RegistryError
from registry.core.fingerprint import Fingerprint
from registry.remote import blobs
from registry.remote.blobs import blob_key, read_blobs
from registry.remote.tier import RemoteTier, scan_names
from registry.trust import remote_signature

log = logging.getLogger(__name__)

MODELS = "model"  # the namespace of compiled models' indexes
BATCH_BYTES = 16 * 2**20  # blobs asked for in one round trip, by their sizes
BATCH_KEYS = 256
MAX_VALUE_BYTES = MAX_INDEX_BYTES + remote_signature.OVERHEAD  # an index in its envelope


def index_key(
    model: str, key_digest: str, fingerprint: Fingerprint, namespace: str = MODELS
) -> str:
    """An index's key; ``namespace``: its family's on the tier (:data:`MODELS`, or a
    declared folder's ``caches``)."""
    return f"{_prefix(namespace)}{model}:{fingerprint.digest()[:32]}:{key_digest}"


def _prefix(namespace: str) -> str:
    return f"triton-warmup:{namespace}:"


def fetch(
    tier: RemoteTier,
    root: Path,
    *,
    model: str,
    key_digest: str,
    fingerprint: Fingerprint,
    namespace: str = MODELS,
) -> bool:
    """Copy the model's index for this key and fingerprint, and the blobs it names that
    ``root`` lacks, from the server into the family at ``root``; True when the index is
    there now. A miss, an outage, anything untrustworthy, or a volume that cannot be
    written is False (and counted)."""
    try:
        return _fetch(tier, root, _Index(model, key_digest, fingerprint, namespace))
    except OSError as e:
        log.warning("model %s: not fetched from the remote tier: %s", model, e)
        return False


class _Index(NamedTuple):
    """Which index a fetch or a publish moves."""

    model: str
    key_digest: str
    fingerprint: Fingerprint
    namespace: str


def _fetch(tier: RemoteTier, root: Path, at: _Index) -> bool:
    model, key_digest, fingerprint, namespace = at
    name = index_key(model, key_digest, fingerprint, namespace)
    answer = tier.call(lambda client: [read_index(client, name)], now=True)
    if answer is None or answer[0] is None:
        tier.stats.misses += answer is not None
        return False
    value = answer[0]
    if isinstance(value, redis_url.Oversized):
        log.warning(
            "remote tier: %s skipped: %d bytes; limit %d", name, value.size, MAX_VALUE_BYTES
        )
        tier.stats.misses += 1
        return False
    raw = tier.opened(name, "", value, code=True)
    if raw is None:  # refused: unsigned, or a key this pod does not trust
        tier.stats.misses += 1
        return False
    index = _trusted_index(name, raw, model, key_digest, fingerprint)
    if index is None or not _fetch_blobs(tier, root, name, index):
        tier.stats.misses += 1
        return False
    atomic.write_bytes(index_path(root, model, key_digest, fingerprint), raw)
    tier.stats.hits += 1
    log.info(
        "model %s: index and %d files fetched from the remote tier", model, len(index["files"])
    )
    return True


def _trusted_index(
    name: str, raw: bytes, model: str, key_digest: str, fingerprint: Fingerprint
) -> dict[str, Any] | None:
    try:
        if len(raw) > MAX_INDEX_BYTES:
            raise RegistryError(f"{len(raw)} bytes; limit {MAX_INDEX_BYTES}")
        values = atomic.json_values(raw)  # before parsing
        if values > MAX_INDEX_VALUES:
            raise RegistryError(f"{values} JSON values; limit {MAX_INDEX_VALUES}")
        index = inductor_cache.parse_index(raw, name)
        theirs = Fingerprint.from_json(index["fingerprint"]).digest()
        if (index["model"], index["key_digest"], theirs) != (
            model,
            key_digest,
            fingerprint.digest(),
        ):
            raise RegistryError("the index of another model, key or fingerprint")
        sizes = sum(size for _, size in index["files"].values())
        if sizes > MAX_MODEL_BYTES:
            raise RegistryError(f"names {sizes} bytes; limit {MAX_MODEL_BYTES}")
    except RegistryError as e:
        log.warning("remote tier: %s skipped: %s", name, e)
        return None
    return index


def _fetch_blobs(tier: RemoteTier, root: Path, name: str, index: Mapping[str, Any]) -> bool:
    sizes = {sha: size for sha, size in index["files"].values()}
    given = index.get("modes")
    modes: dict[str, Any] = given if isinstance(given, dict) else {}
    wanted = [sha for sha in sorted(sizes) if not _present(root, sha, sizes[sha])]
    small = [sha for sha in wanted if not blobs.chunked(sizes[sha])]
    for sha in (sha for sha in wanted if blobs.chunked(sizes[sha])):
        fetch_one = functools.partial(
            _stream_blob, root=root, sha=sha, size=sizes[sha], mode=_mode(modes, sha)
        )
        moved = tier.call(fetch_one, now=True, deadline_s=tier.deadline_for(sizes[sha]))
        if moved is None:
            return False
        if moved.why is not None:
            log.warning(
                "remote tier: %s names blob %s of %d bytes: %s",
                name,
                sha[:16],
                sizes[sha],
                moved.why,
            )
            return False
    for batch in batches(small, sizes):
        limits = [(blob_key(sha), sizes[sha]) for sha in batch]
        values = tier.call(
            functools.partial(read_blobs, limits=limits),
            now=True,
            deadline_s=tier.deadline_for(sum(size for _, size in limits)),
        )
        if values is None:
            return False
        for sha, data in zip(batch, values, strict=True):
            if not isinstance(data, bytes) or len(data) != sizes[sha]:  # never read a surprise
                held = len(data) if isinstance(data, bytes) else getattr(data, "size", 0)
                log.warning(
                    "remote tier: %s names blob %s of %d bytes, which the server holds %s%s",
                    name,
                    sha[:16],
                    sizes[sha],
                    "no longer (evicted?)" if data is None else "otherwise",
                    "" if data is None else f" ({held} bytes; limit {sizes[sha]})",
                )
                return False
            if hashlib.sha256(data).hexdigest() != sha:
                log.warning(
                    "remote tier: %s names blob %s, not the bytes of its name", name, sha[:16]
                )
                return False
            inductor_cache.put_blob(root, data, mode=_mode(modes, sha))
    return True


def _mode(modes: Mapping[str, Any], sha: str) -> int:
    """A fetched blob's mode: 0o644, plus the executable bits its index gives."""
    mode = modes.get(sha)
    return 0o644 | (mode & 0o111 if isinstance(mode, int) and 0 <= mode <= 0o777 else 0)


class _Discard(Exception):
    """A streamed blob not to keep: its temp file is removed."""


def _stream_blob(client: Any, root: Path, sha: str, size: int, mode: int) -> blobs.Moved:
    """Fetch the blob ``sha`` into a temp file beside its place in ``root``, renamed there
    only when it hashes to its name; the volume failing is a ``why``, not an outage."""
    try:
        with atomic.replacing(blob_path(root, sha), mode=mode) as out:
            moved = blobs.read_into(client, sha, size, out)
            if moved.why is not None:
                raise _Discard
    except _Discard:
        return moved
    except OSError as e:  # the volume's (redis-py raises its own errors, none an OSError)
        return blobs.Moved(f"not written here: {e}")
    return moved


def _present(root: Path, sha: str, size: int) -> bool:
    blob = blob_path(root, sha)
    return blob.is_file() and blob.stat().st_size == size


def batches(shas: list[str], sizes: Mapping[str, int]) -> list[list[str]]:
    """Blobs (any names, by ``sizes``) in batches of at most :data:`BATCH_BYTES` and
    :data:`BATCH_KEYS`."""
    batches: list[list[str]] = [[]]
    held = 0
    for sha in shas:
        full = held + sizes[sha] > BATCH_BYTES or len(batches[-1]) >= BATCH_KEYS
        if batches[-1] and full:
            batches.append([])
            held = 0
        batches[-1].append(sha)
        held += sizes[sha]
    return [batch for batch in batches if batch]


def publish(
    tier: RemoteTier,
    root: Path,
    *,
    model: str,
    key_digest: str,
    fingerprint: Fingerprint,
    namespace: str = MODELS,
) -> bool:
    """Publish the model's index for this key and fingerprint from the family at
    ``root``: first each blob the server lacks (one that no longer hashes to its name
    is not published, nor is the index), then the index. True when all went; a volume
    that cannot be read is False."""
    try:
        return _publish(tier, root, _Index(model, key_digest, fingerprint, namespace))
    except OSError as e:  # a blob quarantined meanwhile, a folder in its place
        log.warning("model %s: not published to the remote tier: %s", model, e)
        return False


def _publish(tier: RemoteTier, root: Path, at: _Index) -> bool:
    model, key_digest, fingerprint, namespace = at
    if not tier.may_publish(code=True):
        return False
    path = index_path(root, model, key_digest, fingerprint)
    try:
        index = inductor_cache.read_index(path)
    except (OSError, RegistryError) as e:
        log.warning("model %s: not published to the remote tier: %s", model, e)
        return False
    shas = sorted({sha for sha, _ in index["files"].values()})
    keys = [blob_key(sha) for sha in shas]
    there = tier.call(lambda client: _exists(client, keys), now=True)
    if there is None:
        return False
    sizes = {sha: size for sha, size in index["files"].values()}
    modes = {}
    for sha, held in zip(shas, there, strict=True):
        blob = blob_path(root, sha)
        modes[sha] = blob.stat().st_mode & 0o777 if blob.exists() else 0o644
        if not held and not _publish_blob(tier, blob, sha, sizes[sha], model):
            return False
    name = index_key(model, key_digest, fingerprint, namespace)
    payload = json.dumps({**index, "modes": modes}, sort_keys=True).encode()
    value = tier.seal(name, "", payload)
    write = functools.partial(write_index, key=name, value=value)
    if tier.call(write, now=True, deadline_s=tier.deadline_for(len(value))) is None:
        return False
    tier.sent(name, "", value)
    tier.stats.published += 1
    log.info("model %s: published to the remote tier (%d files)", model, len(shas))
    return True


def _publish_blob(tier: RemoteTier, blob: Path, sha: str, size: int, model: str) -> bool:
    """Send the volume's blob ``sha`` (``size`` bytes, as its index gives) from its file,
    a chunk at a time, within the deadline of its bytes; False when it is not there
    whole (logged) or the call failed."""
    try:
        with atomic.open_bounded(blob, min(size, MAX_FILE_BYTES)) as source:
            if os.fstat(source.fileno()).st_size != size:
                raise ValueError(f"{blob.name} is not {size} bytes")
            send = functools.partial(blobs.upload, sha=sha, size=size, source=source)
            moved = tier.call(send, now=True, deadline_s=tier.deadline_for(size))
    except (OSError, ValueError):  # gone, another size, not a file
        moved = blobs.Moved("missing")
    if moved is not None and moved.why is not None:
        log.warning("model %s: not published: blob %s is missing or damaged", model, sha[:16])
    return moved is not None and moved.why is None


# ---- the values of the family: each read and written in one place ----------------------


def read_index(client: Any, key: str) -> redis_url.Read:
    """The index at ``key`` in its envelope, unless over :data:`MAX_VALUE_BYTES` (then
    its size)."""
    return redis_url.answer(redis_url.get(client, key, MAX_VALUE_BYTES))


def _read_one_index(client: Any, key: str) -> list[redis_url.Read]:
    return [read_index(client, key)]


def write_index(client: Any, key: str, value: bytes) -> list[Any]:
    return [client.set(key, value)]


def _exists(client: Any, keys: list[str]) -> list[bool]:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.exists(key)
        return [bool(n) for n in pipe.execute()]


def stored_fingerprints(
    tier: RemoteTier,
    model: str,
    key_digest: str,
    fingerprint: Fingerprint,
    limit: int = 50,
    namespace: str = MODELS,
) -> list[Fingerprint] | None:
    """For ``explain``: ``[fingerprint]`` when the tier holds this exact index; else the
    fingerprints of up to ``limit`` indexes of ``model`` at ``key_digest`` ([] when it
    holds only other keys of the model: its code or shapes changed); None when it holds
    none of the model or does not answer."""

    def read(client: Any) -> tuple[bool, list[str], bool]:
        if client.exists(index_key(model, key_digest, fingerprint, namespace)):
            return True, [], True
        prefix = _prefix(namespace)
        names = scan_names(client, f"{prefix}{model}:*:{key_digest}", limit)
        if names:
            return False, names, True
        return False, [], bool(scan_names(client, f"{prefix}{model}:*", 1))

    answer = tier.call(read, now=True)
    if answer is None or not answer[2]:
        return None
    if answer[0]:
        return [fingerprint]
    found: list[Fingerprint] = []
    for name in answer[1]:  # one index at a time: each up to MAX_INDEX_BYTES
        raw = tier.call(functools.partial(_read_one_index, key=name), now=True)
        if raw is None:
            return found
        payload = tier.opened(name, "", raw[0], code=True)
        if payload is None:
            continue
        try:
            index = inductor_cache.parse_index(payload, model)
            found.append(Fingerprint.from_json(index["fingerprint"]))
        except (RegistryError, KeyError):
            continue
    return found
