"""Compiled models on the remote tier: the family of :mod:`registry.inductor_cache` on
the same redis server as the tuned entries, so a pod on any node restores a model that
another node compiled, with no shared volume.

Keys::

    triton-warmup:model:<model>:<fingerprint digest[:32]>:<key digest>   an index's JSON
    triton-warmup:blob:<sha256>                                          a file's bytes

An index is published as the volume holds it, plus ``modes`` (sha256 -> file mode: a
compiled kernel's ``.so`` keeps its bits). Blobs go first, each only if the server lacks
it, then the index: a reader that finds an index finds its blobs, unless the server
evicted one, which reads as a miss. Nothing read is trusted: an index must parse
(``parse_index``), name this model, key and fingerprint, and stay within the family's
limits; a blob must hash to its name. Fetched blobs and index are written into the
volume's family (blobs first, each atomically); the caller then restores from there as
from any volume. Both calls are made even while the tier is skipped after a failure:
one round of calls against minutes of compiling. Neither raises.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from registry import atomic, inductor_cache
from registry.errors import RegistryError
from registry.fingerprint import Fingerprint
from registry.inductor_cache import (
    MAX_FILE_BYTES,
    MAX_INDEX_BYTES,
    MAX_INDEX_VALUES,
    MAX_MODEL_BYTES,
    blob_path,
    index_path,
)
from registry.remote import RemoteTier, getter, scan_names

log = logging.getLogger(__name__)

INDEX_PREFIX = "triton-warmup:model:"
BLOB_PREFIX = "triton-warmup:blob:"
BATCH_BYTES = 64 * 2**20  # blobs asked for in one MGET, by their sizes (STRLEN first)
BATCH_KEYS = 256


def index_key(model: str, key_digest: str, fingerprint: Fingerprint) -> str:
    return f"{INDEX_PREFIX}{model}:{fingerprint.digest()[:32]}:{key_digest}"


def blob_key(sha: str) -> str:
    return f"{BLOB_PREFIX}{sha}"


def fetch(
    tier: RemoteTier, root: Path, *, model: str, key_digest: str, fingerprint: Fingerprint
) -> bool:
    """Copy the model's index for this key and fingerprint, and the blobs it names that
    ``root`` lacks, from the server into the family at ``root``; True when the index is
    there now. A miss, an outage, anything untrustworthy, or a volume that cannot be
    written is False (and counted)."""
    try:
        return _fetch(tier, root, model, key_digest, fingerprint)
    except OSError as e:
        log.warning("model %s: not fetched from the remote tier: %s", model, e)
        return False


def _fetch(
    tier: RemoteTier, root: Path, model: str, key_digest: str, fingerprint: Fingerprint
) -> bool:
    name = index_key(model, key_digest, fingerprint)
    answer = tier.call(lambda client: [client.get(name)], now=True)
    if answer is None or answer[0] is None:
        tier.stats.misses += answer is not None
        return False
    raw: bytes = answer[0]
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
    for batch in batches(wanted, sizes):
        keys = [blob_key(sha) for sha in batch]
        held = tier.call(functools.partial(_lengths, keys=keys), now=True)
        if held is None or held != [sizes[sha] for sha in batch]:  # never read a surprise
            if held is not None:
                log.warning("remote tier: %s names blobs the server lacks or holds otherwise", name)
            return False
        values = tier.call(getter(keys), now=True)
        if values is None:
            return False
        for sha, data in zip(batch, values, strict=True):
            if data is None or len(data) != sizes[sha] or hashlib.sha256(data).hexdigest() != sha:
                why = "gone (evicted?)" if data is None else "not the bytes of its name"
                log.warning("remote tier: %s names blob %s, which is %s", name, sha[:16], why)
                return False
            mode = modes.get(sha)
            executable = mode & 0o111 if isinstance(mode, int) and 0 <= mode <= 0o777 else 0
            inductor_cache.put_blob(root, data, mode=0o644 | executable)
    return True


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
    tier: RemoteTier, root: Path, *, model: str, key_digest: str, fingerprint: Fingerprint
) -> bool:
    """Publish the model's index for this key and fingerprint from the family at
    ``root``: first each blob the server lacks (one that no longer hashes to its name
    is not published, nor is the index), then the index. True when all went; a volume
    that cannot be read is False."""
    try:
        return _publish(tier, root, model, key_digest, fingerprint)
    except OSError as e:  # a blob quarantined meanwhile, a folder in its place
        log.warning("model %s: not published to the remote tier: %s", model, e)
        return False


def _publish(
    tier: RemoteTier, root: Path, model: str, key_digest: str, fingerprint: Fingerprint
) -> bool:
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
    modes = {}
    for sha, held in zip(shas, there, strict=True):
        blob = blob_path(root, sha)
        modes[sha] = blob.stat().st_mode & 0o777 if blob.exists() else 0o644
        if held:
            continue
        try:
            data = atomic.read_bounded(blob, MAX_FILE_BYTES)  # read once: hashed, then sent
        except (OSError, ValueError):  # gone, too big, not a file
            data = b""
        if hashlib.sha256(data).hexdigest() != sha:
            log.warning("model %s: not published: blob %s is missing or damaged", model, sha[:16])
            return False
        if tier.call(_setter(blob_key(sha), data), now=True) is None:
            return False
    value = json.dumps({**index, "modes": modes}, sort_keys=True).encode()
    name = index_key(model, key_digest, fingerprint)
    if tier.call(_setter(name, value), now=True) is None:
        return False
    tier.stats.published += 1
    log.info("model %s: published to the remote tier (%d files)", model, len(shas))
    return True


def _lengths(client: Any, keys: list[str]) -> list[int]:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.strlen(key)
        return [int(n) for n in pipe.execute()]


def _exists(client: Any, keys: list[str]) -> list[bool]:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.exists(key)
        return [bool(n) for n in pipe.execute()]


def _setter(key: str, value: bytes) -> Callable[[Any], list[Any]]:
    return lambda client: [client.set(key, value)]


def stored_fingerprints(
    tier: RemoteTier, model: str, key_digest: str, fingerprint: Fingerprint, limit: int = 50
) -> list[Fingerprint] | None:
    """For ``explain``: ``[fingerprint]`` when the tier holds this exact index; else the
    fingerprints of up to ``limit`` indexes of ``model`` at ``key_digest`` ([] when it
    holds only other keys of the model: its code or shapes changed); None when it holds
    none of the model or does not answer."""

    def read(client: Any) -> tuple[bool, list[bytes | None], bool]:
        if client.exists(index_key(model, key_digest, fingerprint)):
            return True, [], True
        names = scan_names(client, f"{INDEX_PREFIX}{model}:*:{key_digest}", limit)
        if names:
            return False, list(client.mget(names)), True
        return False, [], bool(scan_names(client, f"{INDEX_PREFIX}{model}:*", 1))

    answer = tier.call(read, now=True)
    if answer is None or not answer[2]:
        return None
    if answer[0]:
        return [fingerprint]
    found = []
    for raw in answer[1]:
        if raw is None or len(raw) > MAX_INDEX_BYTES:
            continue
        try:
            index = inductor_cache.parse_index(raw, model)
            found.append(Fingerprint.from_json(index["fingerprint"]))
        except (RegistryError, KeyError):
            continue
    return found
