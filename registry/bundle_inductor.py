"""Compiled models' artifacts in a bundle: the family of :mod:`registry.inductor_cache`.

Members, beside ``entries/`` and ``triton-cache/``::

    inductor/models/<model>/<gpu>/<software>/<key>.json    an index, as the volume holds it
    inductor/blobs/<sha[:2]>/<sha256>                      a file an index names, by content

A bundle is whole: every blob an index names is in it (with the size the index gives),
and every blob in it is named by an index. A blob's name is its sha256, and MANIFEST.json
must list that sha256 for it. An index must sit where its own model, key and fingerprint
put it; its fingerprint is checked as an entry's is (a mismatch rejects the bundle unless
forced) and is one of MANIFEST.json's ``fingerprints``.

Install stages blobs and indexes in ``<root>/.bundle-*``. Before the store's swap, each
index the bundle replaces is kept as a blob and named in the new generation's record
(:data:`RECORD_KEY`: index path -> the previous index's sha256, or null where there was
none); after the swap the blobs move in, then the indexes. :func:`undo`, run by
``Store.rollback`` after its swap, puts each previous index back, or removes the index
where there was none. Blobs are never removed: they are content, and harmless unnamed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from registry import atomic, inductor_cache
from registry.errors import RegistryError
from registry.fingerprint import Fingerprint
from registry.generations import Record
from registry.inductor_cache import MAX_INDEX_BYTES, blob_path, blob_relpath, placed
from registry.patterns import SHA256

log = logging.getLogger(__name__)

PREFIX = "inductor/"
RECORD_KEY = "inductor_indexes"
MAX_BUNDLE_FILES = 4 * inductor_cache.MAX_FILES  # files all of a bundle's indexes restore


@dataclass
class Packed:
    """What ``bundle create`` takes from a family: member name -> file, and fingerprints."""

    members: dict[str, Path] = field(default_factory=dict)
    fingerprints: list[Fingerprint] = field(default_factory=list)
    indexes: int = 0


def pack(root: Path, *, model: str | None = None) -> Packed:
    """Every index under ``root`` (of ``model`` only, if given) with the blobs it names;
    :class:`RegistryError` for an index that is unreadable, misplaced or names a blob
    the family lacks (a bundle is never written short of a file)."""
    packed = Packed()
    folder = root / "models"
    for path in inductor_cache.index_files(folder):
        if model is not None and path.relative_to(folder).parts[0] != model:
            continue
        rel = path.relative_to(root).as_posix()
        index = inductor_cache.read_index(path)
        if placed(index) != rel:
            raise RegistryError(f"{path}: its model, key and fingerprint belong elsewhere")
        packed.members[PREFIX + rel] = path
        packed.fingerprints.append(Fingerprint.from_json(index["fingerprint"]))
        packed.indexes += 1
        for file, (sha, _) in sorted(index["files"].items()):
            blob = blob_path(root, sha)
            if not blob.is_file():
                raise RegistryError(
                    f"{path} names blob {sha[:16]} ({file}), which {root} lacks: warm "
                    f"model {index['model']} again, or leave it out"
                )
            packed.members[PREFIX + blob_relpath(sha)] = blob
    if model is not None and not packed.indexes:
        raise RegistryError(f"no artifacts of model {model} are stored in {root}")
    return packed


def is_member(name: str) -> bool:
    return name.startswith(PREFIX)


def is_index(name: str) -> bool:
    return name.startswith(f"{PREFIX}models/")


def is_blob(name: str) -> bool:
    return is_member(name) and not is_index(name)


def check_listed(name: str, sha: str) -> None:
    """A listed ``inductor/`` member's name (and a blob's listed sha256, its name);
    ValueError with the reason otherwise."""
    rel = name.removeprefix(PREFIX)
    parts = PurePosixPath(rel).parts
    if parts[:1] == ("blobs",):
        if len(parts) != 3 or not SHA256.fullmatch(parts[2]) or parts[1] != parts[2][:2]:
            raise ValueError("is not inductor/blobs/<sha256[:2]>/<sha256>")
        if sha != parts[2]:
            raise ValueError(f"is listed with sha256 {sha[:16]}, not its name")
        return
    if not _is_index_path(rel):
        raise ValueError(
            "is neither inductor/models/<model>/<gpu>/<software>/<key>.json "
            "nor inductor/blobs/<sha256[:2]>/<sha256>"
        )


def check_index(name: str, text: bytes, listed: Mapping[str, tuple[str, int]]) -> dict[str, Any]:
    """An index member, parsed and checked against its place and the bundle's members."""
    index = inductor_cache.parse_index(text, name)
    if PREFIX + placed(index) != name:
        raise RegistryError(f"{name}: its model, key and fingerprint belong elsewhere")
    for file, (sha, size) in index["files"].items():
        blob = PREFIX + blob_relpath(sha)
        if blob not in listed:
            raise RegistryError(f"{name}: names blob {sha[:16]} ({file}), which it lacks")
        if listed[blob][1] != size:
            raise RegistryError(
                f"{name}: gives {file} {size} bytes; its blob has {listed[blob][1]}"
            )
    return index


class Restores:
    """What a bundle's indexes restore together, counted as each one comes: each distinct
    (path, blob) is a file written at the blob's size, so one blob named under many paths
    counts once a path, and a path two indexes give the same blob counts once. Held as
    keyed 8-byte digests (no bundle can choose paths that collide), ``max_files`` at most."""

    def __init__(self, max_bytes: int, max_files: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_files = MAX_BUNDLE_FILES if max_files is None else max_files
        self.bytes = 0
        self._seen: set[bytes] = set()
        self._key = os.urandom(16)

    def add(self, name: str, index: Mapping[str, Any]) -> None:
        """Count the files of the index member ``name``; :class:`RegistryError` naming it
        and the limit once the bundle's indexes so far restore more than the limits."""
        for rel, (sha, size) in index["files"].items():
            mark = hashlib.blake2b(f"{rel}\0{sha}".encode(), digest_size=8, key=self._key).digest()
            if mark not in self._seen:
                self._seen.add(mark)
                self.bytes += size
            if len(self._seen) > self.max_files:
                raise RegistryError(
                    f"{name}: the bundle's indexes up to it restore {len(self._seen)} "
                    f"files; limit {self.max_files}"
                )
        if self.bytes > self.max_bytes:
            raise RegistryError(
                f"{name}: the bundle's indexes up to it restore {self.bytes} bytes (each path "
                f"counted); limit {self.max_bytes}"
            )


def check_blobs(listed: Mapping[str, tuple[str, int]], named: set[str]) -> str | None:
    """The first blob member no index names, if any."""
    for name in sorted(listed):
        if is_blob(name) and name not in named:
            return name
    return None


def named_blobs(index: Mapping[str, Any]) -> set[str]:
    return {PREFIX + blob_relpath(sha) for sha, _ in index["files"].values()}


def whole_indexes(root: Path, staged: Path | None, indexes: list[str]) -> list[str]:
    """Of the staged ``indexes``, those whose every blob is in the family at ``root`` now
    (after the blobs moved in): one short of a blob stays out, and its model recompiles."""
    whole: list[str] = []
    if staged is None:  # nothing was staged
        return whole
    for rel in indexes:
        try:
            index = inductor_cache.read_index(staged / rel)
            missing = [
                sha for sha, _ in index["files"].values() if not blob_path(root, sha).is_file()
            ]
        except (OSError, RegistryError) as e:
            missing = [str(e)]
        if missing:
            log.error(
                "inductor index %s not installed: %d of its files did not move in",
                rel,
                len(missing),
            )
        else:
            whole.append(rel)
    return whole


def keep_previous(root: Path, indexes: list[str]) -> dict[str, Any]:
    """For each index path (``models/...``) an install will replace: the sha256 of what
    is there now, kept as a blob, or None where there is nothing (or nothing readable);
    as the record's :data:`RECORD_KEY`."""
    previous: dict[str, str | None] = {}
    for rel in indexes:
        try:
            data = atomic.read_bounded(root / rel, MAX_INDEX_BYTES)
        except FileNotFoundError:
            previous[rel] = None
            continue
        except (OSError, ValueError) as e:  # broken: nothing worth putting back
            log.warning("inductor index %s replaced without a copy to roll back to: %s", rel, e)
            previous[rel] = None
            continue
        previous[rel] = inductor_cache.put_blob(root, data)[0]
    return {RECORD_KEY: previous}


def undo(root: Path, record: Record) -> int:
    """Put back the indexes an install replaced (``Store.rollback``'s after-swap step);
    returns how many it changed. A previous index whose blob is gone or damaged is not
    restored: that index is removed, so the model recompiles rather than load what the
    rolled-back bundle brought."""
    previous = record.extra.get(RECORD_KEY)
    if not isinstance(previous, dict):
        return 0
    changed = 0
    for rel, sha in sorted(previous.items()):
        if not _is_index_path(rel) or not (sha is None or SHA256.fullmatch(str(sha))):
            log.error("rollback: %s of %s is not an index path and sha256; skipped", rel, record.id)
            continue
        try:
            _put_back(root, rel, sha)
        except OSError as e:  # this one; the others still go back
            log.error("rollback: %s of %s not put back: %s", rel, record.id, e)
            continue
        changed += 1
    return changed


def _put_back(root: Path, rel: str, sha: str | None) -> None:
    target = root / rel
    data = None if sha is None else _blob_bytes(root, sha)
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        if sha is not None:
            log.error("rollback: the previous %s is lost; removed (its model recompiles)", rel)
    else:
        atomic.write_bytes(target, data)


def _blob_bytes(root: Path, sha: str) -> bytes | None:
    try:
        data = atomic.read_bounded(blob_path(root, sha), MAX_INDEX_BYTES)
    except (OSError, ValueError):
        return None
    return data if hashlib.sha256(data).hexdigest() == sha else None


def _is_index_path(rel: object) -> bool:
    if not isinstance(rel, str):
        return False
    try:
        inductor_cache.check_relative(rel)
    except RegistryError:
        return False
    parts = PurePosixPath(rel).parts
    return len(parts) == 5 and parts[0] == "models" and rel.endswith(".json")
