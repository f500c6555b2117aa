"""A keyed family's files in a bundle: indexes and the blobs they name, under the
family's folder (``inductor/``, ``caches/``), as :mod:`registry.caches.inductor_cache` lays
them out on the volume::

    <prefix>models/<name>/<gpu>/<software>/<key>.json    an index, as the volume holds it
    <prefix>blobs/<sha[:2]>/<sha256>                     a file an index names, by content

A bundle is whole: every blob an index names is in it (with the size the index gives),
and every blob in it is named by an index. A blob's name is its sha256, and MANIFEST.json
must list that sha256 for it. An index must sit where its own name, key and fingerprint
put it; its fingerprint is checked as an entry's is (a mismatch rejects the bundle unless
forced) and is one of MANIFEST.json's ``fingerprints``.

Install stages blobs and indexes in ``<root>/.bundle-*``. Before the store's swap, each
index the bundle replaces is kept as a blob and named in the new generation's record
(the part's ``record_key``: index path -> the previous index's sha256, or null where
there was none); after the swap the blobs move in, then the indexes. :meth:`IndexedFiles.undo`,
run by ``Store.rollback`` after its swap, puts each previous index back, or removes the
index where there was none. Blobs are never removed: they are content, and harmless unnamed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from registry.caches import inductor_cache
from registry.caches.inductor_cache import MAX_INDEX_BYTES, blob_path, blob_relpath, placed
from registry.core import atomic
from registry.core.errors import BundleRejected, RegistryError
from registry.core.fingerprint import Fingerprint
from registry.core.patterns import SHA256
from registry.families.bundle_parts import BundlePart, Packed, PartReader
from registry.families.staging import Stage
from registry.storage.generations import Record

if TYPE_CHECKING:
    from registry.bundles.bundle import Limits

log = logging.getLogger(__name__)

MAX_BUNDLE_FILES = 4 * inductor_cache.MAX_FILES  # files all of a bundle's indexes restore


class IndexedFiles(BundlePart):
    """A keyed family's indexes and blobs under ``prefix``; ``record_key``: where the
    new generation's record keeps the indexes an install replaced; ``counted``: the
    record's key for how many indexes it installed; ``thing``: what an index is of, in
    messages ("compiled model")."""

    def __init__(
        self, prefix: str, record_key: str, counted: str, thing: str, *, per_name: bool = False
    ) -> None:
        self.per_name = per_name  # each name restores into a folder of its own
        self.prefix, self.record_key, self.counted, self.thing = prefix, record_key, counted, thing
        self.option = prefix.rstrip("/")
        self.what = f"{thing}s' artifacts"  # "compiled models' artifacts"

    def destination(self, index: Mapping[str, Any]) -> str:
        """Where an index restores its files, as far as the bundle's restore budget
        tells places apart: one folder for the family (``inductor/``), or one per name
        (a declared folder's: ``caches/vllm``)."""
        return self.prefix + (str(index["model"]) if self.per_name else "")

    def is_index(self, name: str) -> bool:
        return name.startswith(f"{self.prefix}models/")

    def is_blob(self, name: str) -> bool:
        return self.owns(name) and not self.is_index(name)

    def pack(self, root: Path, *, only: str | None = None) -> Packed:
        """Every index under ``root`` (of ``only`` only, if given) with the blobs it names;
        :class:`RegistryError` for an index that is unreadable, misplaced or names a blob
        the family lacks (a bundle is never written short of a file)."""
        packed = Packed()
        folder = root / "models"
        for path in inductor_cache.index_files(folder):
            if only is not None and path.relative_to(folder).parts[0] != only:
                continue
            rel = path.relative_to(root).as_posix()
            index = inductor_cache.read_index(path)
            if placed(index) != rel:
                raise RegistryError(f"{path}: its name, key and fingerprint belong elsewhere")
            packed.members[self.prefix + rel] = path
            packed.fingerprints.append(Fingerprint.from_json(index["fingerprint"]))
            packed.indexes += 1
            for file, (sha, _) in sorted(index["files"].items()):
                blob = blob_path(root, sha)
                if not blob.is_file():
                    raise RegistryError(
                        f"{path} names blob {sha[:16]} ({file}), which {root} lacks: save "
                        f"{index['model']} again, or leave it out"
                    )
                packed.members[self.prefix + blob_relpath(sha)] = blob
        return packed

    def limit(self, label: str, name: str, limits: Limits) -> tuple[str, int]:
        if self.is_index(name):
            return "index", min(limits.max_member_bytes, limits.max_index_bytes)
        return "member", limits.max_member_bytes

    def check_sha(self, label: str, name: str, sha: str) -> None:
        try:
            self.check_listed(name, sha)
        except ValueError as e:
            raise BundleRejected(label, f"member '{name}' {e}") from None

    def check_listed(self, name: str, sha: str) -> None:
        """A listed member's name (and a blob's listed sha256, its name); ValueError with
        the reason otherwise."""
        rel = name.removeprefix(self.prefix)
        parts = PurePosixPath(rel).parts
        if parts[:1] == ("blobs",):
            if len(parts) != 3 or not SHA256.fullmatch(parts[2]) or parts[1] != parts[2][:2]:
                raise ValueError(f"is not {self.prefix}blobs/<sha256[:2]>/<sha256>")
            if sha != parts[2]:
                raise ValueError(f"is listed with sha256 {sha[:16]}, not its name")
            return
        if not _is_index_path(rel):
            raise ValueError(
                f"is neither {self.prefix}models/<name>/<gpu>/<software>/<key>.json "
                f"nor {self.prefix}blobs/<sha256[:2]>/<sha256>"
            )

    def check_index(
        self, name: str, text: bytes, listed: Mapping[str, tuple[str, int]]
    ) -> dict[str, Any]:
        """An index member, parsed and checked against its place and the bundle's members."""
        index = inductor_cache.parse_index(text, name)
        if self.prefix + placed(index) != name:
            raise RegistryError(f"{name}: its name, key and fingerprint belong elsewhere")
        for file, (sha, size) in index["files"].items():
            blob = self.prefix + blob_relpath(sha)
            if blob not in listed:
                raise RegistryError(f"{name}: names blob {sha[:16]} ({file}), which it lacks")
            if listed[blob][1] != size:
                raise RegistryError(
                    f"{name}: gives {file} {size} bytes; its blob has {listed[blob][1]}"
                )
        return index

    def named_blobs(self, index: Mapping[str, Any]) -> set[str]:
        return {self.prefix + blob_relpath(sha) for sha, _ in index["files"].values()}

    def reader(
        self, label: str, limits: Limits, stage: Stage | None, budget: Any = None
    ) -> PartReader:
        return IndexedReader(self, label, limits, stage, budget)

    def record_keys(self) -> tuple[str, ...]:
        return (self.record_key,)

    def describe(self, names: list[str]) -> str:
        indexes = sum(map(self.is_index, names))
        return f"{indexes} {self.thing} indexes ({len(names) - indexes} files)"

    def undo(self, root: Path, record: Record) -> int:
        """Put back the indexes an install replaced (``Store.rollback``'s after-swap step);
        returns how many it changed. A previous index whose blob is gone or damaged is not
        restored: that index is removed, so its user compiles again rather than load what
        the rolled-back bundle brought."""
        previous = record.extra.get(self.record_key)
        if not isinstance(previous, dict):
            return 0
        changed = 0
        for rel, sha in sorted(previous.items()):
            if not _is_index_path(rel) or not (sha is None or SHA256.fullmatch(str(sha))):
                log.error(
                    "rollback: %s of %s is not an index path and sha256; skipped", rel, record.id
                )
                continue
            try:
                _put_back(root, rel, sha)
            except OSError as e:  # this one; the others still go back
                log.error("rollback: %s of %s not put back: %s", rel, record.id, e)
                continue
            changed += 1
        return changed


class IndexedReader(PartReader):
    """A keyed family's members of one bundle: each index checked and counted as it
    comes, each blob hashed; at the end, no blob that no index names."""

    part: IndexedFiles

    def __init__(
        self,
        part: IndexedFiles,
        label: str,
        limits: Limits,
        stage: Stage | None,
        budget: Restores | None = None,
    ) -> None:
        super().__init__(part, label, limits, stage, budget or Restores(limits.max_total_bytes))
        self.named: set[str] = set()  # blob members the indexes so far name

    def read(self, name: str, sha: str, data: Iterator[bytes]) -> None:
        if not self.part.is_index(name):
            super().read(name, sha, data)  # a blob
            return
        text = b"".join(self.hashed(name, sha, data))
        values = atomic.json_values(text)
        if values > self.limits.max_index_values:
            raise BundleRejected(
                self.label,
                f"index '{name}' has {values} JSON values; limit {self.limits.max_index_values}",
            )
        try:
            index = self.part.check_index(name, text, self.listed)
            # bounded like the members: each path counted, in the folder it restores to
            self.budget.add(name, index, where=self.part.destination(index))
        except RegistryError as e:
            raise BundleRejected(self.label, str(e)) from None
        fingerprint = Fingerprint.from_json(index["fingerprint"])
        if self.check is not None:
            self.check(f"{self.part.thing} index {name}", fingerprint)
        rel = name.removeprefix(self.part.prefix)
        if self.stage is not None:
            self.stage.write(self.label, rel, [text])
        self.indexes.append(rel)
        self.named |= self.part.named_blobs(index)
        self.digests.setdefault(fingerprint.digest(), name)

    def finish(self) -> None:
        for name in sorted(self.listed):
            if self.part.is_blob(name) and name not in self.named:
                raise BundleRejected(self.label, f"blob '{name}' is named by no index")

    def before_seal(self) -> dict[str, Any]:
        """For each index path the install will replace: the sha256 of what is there now,
        kept as a blob, or None where there is nothing (or nothing readable)."""
        if self.stage is None or not self.indexes:
            return {}
        root, previous = self.stage.cache, dict[str, str | None]()
        for rel in self.indexes:
            try:
                data = atomic.read_bounded(root / rel, MAX_INDEX_BYTES)
            except FileNotFoundError:
                previous[rel] = None
                continue
            except (OSError, ValueError) as e:  # broken: nothing worth putting back
                log.warning("index %s replaced without a copy to roll back to: %s", rel, e)
                previous[rel] = None
                continue
            previous[rel] = inductor_cache.put_blob(root, data)[0]
        return {self.part.record_key: previous}

    def commit(self) -> None:
        """After the swap: the blobs, then the indexes whose every blob is in now."""
        if self.stage is None:
            return
        self.stage.commit(self.files)
        self.stage.commit(self._whole_indexes())

    def _whole_indexes(self) -> list[str]:
        """Of the staged indexes, those whose every blob is in the family now: one short
        of a blob stays out, and its user compiles again."""
        assert self.stage is not None
        root, staged, whole = self.stage.cache, self.stage.root, list[str]()
        if staged is None:  # nothing was staged
            return whole
        for rel in self.indexes:
            try:
                index = inductor_cache.read_index(staged / rel)
                missing = [
                    sha for sha, _ in index["files"].values() if not blob_path(root, sha).is_file()
                ]
            except (OSError, RegistryError) as e:
                missing = [str(e)]
            if missing:
                log.error(
                    "index %s not installed: %d of its files did not move in", rel, len(missing)
                )
            else:
                whole.append(rel)
        return whole

    def record(self) -> dict[str, int]:
        return {self.part.counted: len(self.indexes)}


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

    def add(self, name: str, index: Mapping[str, Any], *, where: str = "") -> None:
        """Count the files of the index member ``name`` (restored into the folder
        ``where`` stands for); :class:`RegistryError` naming it and the limit once the
        bundle's indexes so far restore more than the limits."""
        for rel, (sha, size) in index["files"].items():
            text = f"{where}\0{rel}\0{sha}".encode()
            mark = hashlib.blake2b(text, digest_size=8, key=self._key).digest()
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
