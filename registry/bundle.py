"""Bundles: one archive of registry entries and, optionally, Triton compile artifacts.

Archive (tar, gzip) members, MANIFEST.json first (after SIGNATURE.json, if signed)::

    SIGNATURE.json                    Ed25519 signature of MANIFEST.json's bytes: bundle_signature
    MANIFEST.json                     format, schema, name, version, created,
                                      fingerprints covered, sha256 and size of every member
    entries/<kernel>/<gpu>/<software>/<shape>.json
    triton-cache/<hash>/<artifact>
    inductor/models/<model>/<gpu>/<software>/<key>.json    compiled models: bundle_inductor
    inductor/blobs/<sha[:2]>/<sha256>

Trust (:class:`registry.signing.Trust`): where trusted keys are configured, ``verify``
and ``install`` refuse a bundle that is unsigned, signed by an unknown key, or whose
signature does not verify, as soon as MANIFEST.json is read, before it is parsed and
before any other member is read. The signature covers MANIFEST.json, which lists the
sha256 of every other member, so it vouches for every byte installed.

``verify`` and ``install`` read the archive once, as a stream, in bounded memory
(:mod:`registry.tar_stream`): each limit is checked before the bytes it guards are read
(a header's size before its content, a member's size before its data), every member is
hashed in 1 MiB pieces, and artifacts go to a staging folder on disk, never into memory.
The limits (:class:`Limits`; each is also a keyword of ``verify`` and ``install``):

- the file no bigger than a bundle within these limits can be (checked before reading);
- at most 32,768 members, each name at most 1,024 bytes (each part at most 255), under
  ``entries/``, ``triton-cache/<hash>/`` (``<hash>``: 1 to 128 of ``A-Za-z0-9_=-``; an
  artifact's name never starts with a dot) or ``inductor/``; regular files and folders
  only;
- at most 8 KiB of tar headers per member (its header block, GNU long names, PAX
  records): tarfile would read a 1 GiB header into memory before any other check; no
  negative sizes, no PAX record with a run of over 100 digits (CVE-2024-6232);
- MANIFEST.json first, at most 8 MiB; every member exactly the size and sha256 it lists,
  at most 256 MiB, all together at most 2 GiB; a Triton group file at most 1 MiB; an
  entry at most 1 MiB, all entries at most 16 MiB; a compiled model's index at most 16 MiB;
- JSON values (counted before parsing, as the bytes ``{ [ , :``): MANIFEST.json at most
  262,144, an entry at most 32,768, all entries at most 262,144, an index at most
  524,288. A value can become
  ~1 KiB of objects once parsed and written to the store (``[{},{},...]`` is 3 bytes
  a measurement), so bytes alone do not bound memory;
- MANIFEST.json's ``fingerprints`` (objects with string ``digest``, ``gpu``,
  ``software``) are exactly those of the entries and indexes.

With these, a process verifying or installing any bundle stays within 128 MiB of its
idle size (``bench/bundle_memory.py`` measures it).

``install`` is all or nothing: it parses every entry and computes its path, checks the
fingerprints (unless ``force``), stages the artifacts in ``<triton_cache>/.bundle-*``
(compiled models' in ``<inductor>/.bundle-*``), swaps in a new store generation in one
rename, and only then, still under the store's lock, moves the artifacts into place. On
any failure before the swap it removes the staging folder and leaves the cache and the
store as they were. After the swap an artifact that cannot move, or a group file that
cannot be rewritten, is logged: it costs a recompile, not the install. :func:`rollback`
undoes an install, compiled models' indexes included.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import itertools
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from registry import atomic, bundle_inductor, bundle_signature, tar_stream
from registry.entry import Entry, now_iso
from registry.errors import BundleRejected, RegistryError, short, shown, why
from registry.fingerprint import Fingerprint, MatchPolicy
from registry.generations import Generation, Record
from registry.inductor_cache import MAX_INDEX_VALUES
from registry.patterns import SHA256, TRITON_CACHE_KEY
from registry.signing import Signature, SigningKey, Trust, Untrusted
from registry.store import Store
from registry.tar_stream import CHUNK
from registry.triton_cache import MAX_GROUP_BYTES, STAGING_PREFIX, cache_files, is_group, relocate

log = logging.getLogger(__name__)

FORMAT = "triton-warmup-bundle"
SCHEMA = 1
MANIFEST = "MANIFEST.json"
ENTRIES = "entries"
TRITON_CACHE = "triton-cache"
MAX_MEMBER_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 2 * 2**30
MAX_PART_BYTES = 255  # a file name on Linux file systems (NAME_MAX)


@dataclass(frozen=True)
class Limits:
    """What a bundle may hold; each limit is checked before the bytes it guards are read."""

    max_members: int = 32_768
    max_name_bytes: int = 1024
    max_header_bytes: int = 8 * 2**10  # per member: header block, GNU long names, PAX records
    max_member_bytes: int = MAX_MEMBER_BYTES
    max_total_bytes: int = MAX_TOTAL_BYTES
    max_manifest_bytes: int = 8 * 2**20
    max_entry_bytes: int = 2**20
    max_entries_bytes: int = 16 * 2**20
    max_index_bytes: int = 16 * 2**20  # a compiled model's index: ~180 bytes a file
    max_group_bytes: int = MAX_GROUP_BYTES  # relocate reads each whole, after the swap
    # JSON values (counted before parsing) bound the objects a text becomes, which its
    # bytes do not: "[{},{},...]" is 3 bytes a value, a parsed and stored one ~1 KiB.
    max_manifest_values: int = 2**18
    max_entry_values: int = 2**15
    max_entries_values: int = 2**18
    max_index_values: int = MAX_INDEX_VALUES


@dataclass
class Bundle:
    """A verified bundle: its manifest, its entries and the names of its compile artifacts."""

    path: Path
    manifest: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)  # "<hash>/<file>"; bytes stay on disk
    indexes: list[str] = field(default_factory=list)  # compiled models': "models/..."
    blobs: list[str] = field(default_factory=list)  # the files they name: "blobs/..."
    sha256: str = ""
    manifest_sha256: str = ""  # what it holds: the same whether signed or not
    signed_by: str | None = None  # the key id of its signature, checked or not

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])


# ---- create ------------------------------------------------------------------------


def create(
    out: Path,
    *,
    name: str,
    version: str,
    entries: Iterable[Entry],
    triton_cache: Path | None = None,
    inductor: Path | None = None,
    model: str | None = None,
    signer: SigningKey | None = None,
) -> dict[str, Any]:
    """Write a bundle of ``entries`` (and the artifacts in ``triton_cache``, and the
    compiled models stored in the family at ``inductor``, of ``model`` only if given)
    to ``out``, signed by ``signer`` if given.

    Artifacts are hashed, then copied, in pieces; they must not change meanwhile."""
    if not name or not version:
        raise RegistryError(f"Bundle needs a name and a version; got {name!r} and {version!r}.")
    members, fingerprints = _gather(entries, triton_cache, inductor, model)
    if not members:
        raise RegistryError(f"Bundle '{name}' would be empty: no entries and no artifacts.")
    listed = {p: _summary(src) for p, src in sorted(members.items())}
    _check_blob_names(members, listed)
    manifest = {
        "format": FORMAT,
        "schema": SCHEMA,
        "name": name,
        "version": version,
        "created": now_iso(),
        "fingerprints": [fingerprints[k] for k in sorted(fingerprints)],
        "members": listed,
    }
    text = atomic.dumps(manifest).encode()
    signature = None if signer is None else signer.sign(bundle_signature.DOMAIN, text)
    _write_archive(out, text, members, listed, signature)
    return manifest


def sign(path: Path, key: SigningKey, *, out: Path | None = None) -> Bundle:
    """Verify the unsigned bundle at ``path``, then sign it with ``key`` into ``out``
    (default: in place); the signed bundle, verified against ``key``."""
    checked = verify(path)
    target = out or path
    bundle_signature.sign(
        path,
        target,
        key,
        MANIFEST,
        Limits().max_manifest_bytes,
        verified_sha256=checked.manifest_sha256,
    )
    public = {key.key_id: key.public_key()}
    return verify(target, trust=Trust(public))


def _gather(
    entries: Iterable[Entry],
    triton_cache: Path | None,
    inductor: Path | None,
    model: str | None,
) -> tuple[dict[str, bytes | Path], dict[str, dict[str, Any]]]:
    """The bundle's members by name (an entry's bytes, or the file to copy), and the
    fingerprints they were made for, each described, by digest."""
    members: dict[str, bytes | Path] = {}
    fingerprints: dict[str, dict[str, Any]] = {}
    for entry in entries:
        members[f"{ENTRIES}/{entry.relpath().as_posix()}"] = atomic.dumps(entry.to_json()).encode()
        fingerprints[entry.fingerprint.digest()] = _describe(entry.fingerprint)
    if triton_cache is not None:
        for rel, path in cache_files(triton_cache):
            members[f"{TRITON_CACHE}/{rel.as_posix()}"] = path
    if inductor is not None:
        packed = bundle_inductor.pack(inductor, model=model)
        members.update(packed.members)
        fingerprints.update({fp.digest(): _describe(fp) for fp in packed.fingerprints})
    return members, fingerprints


def _check_blob_names(
    members: Mapping[str, bytes | Path], listed: Mapping[str, dict[str, Any]]
) -> None:
    """A compiled model's blob is named by its hash: one that hashed to another name
    changed in the family, and a bundle must not carry it."""
    for member, item in listed.items():
        if bundle_inductor.is_blob(member) and PurePosixPath(member).name != item["sha256"]:
            raise RegistryError(
                f"{members[member]!s} no longer hashes to its name: the family is damaged "
                "(a restore quarantines it; the next warm stores it again)"
            )


def _describe(fp: Fingerprint) -> dict[str, Any]:
    return {"digest": fp.digest(), "gpu": fp.gpu_slug(), "software": fp.software_slug()}


def _summary(src: bytes | Path) -> dict[str, Any]:
    if isinstance(src, bytes):
        return {"sha256": _sha(src), "size": len(src)}
    sha, size = hashlib.sha256(), 0
    with src.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"sha256": sha.hexdigest(), "size": size}


def _write_archive(
    out: Path,
    manifest: bytes,
    members: dict[str, bytes | Path],
    listed: dict[str, Any],
    signature: Signature | None,
) -> None:
    """Stream the archive into a temp file beside ``out``, then rename it into place."""
    with (
        atomic.replacing(out) as f,
        tarfile.open(fileobj=f, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar,
    ):
        if signature is not None:
            text = bundle_signature.encode(signature)
            _add(tar, bundle_signature.SIGNATURE, io.BytesIO(text), len(text))
        _add(tar, MANIFEST, io.BytesIO(manifest), len(manifest))
        for name, src in sorted(members.items()):
            with io.BytesIO(src) if isinstance(src, bytes) else src.open("rb") as data:
                _add(tar, name, data, listed[name]["size"])


def _add(tar: tarfile.TarFile, name: str, data: BinaryIO, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    tar.addfile(info, data)


# ---- verify --------------------------------------------------------------------------


def verify(path: Path, *, trust: Trust | None = None, **limits: int) -> Bundle:
    """Read and check the whole bundle; raise :class:`BundleRejected` naming the first fault.

    ``trust``: the keys it must be signed by (default: trust not configured, any
    signature is only decoded). ``limits``: fields of :class:`Limits` to change, e.g.
    ``max_member_bytes=2**20``."""
    return _read(path, Limits(**limits), stage=None, installing=False, trust=trust)


def _read(
    path: Path,
    limits: Limits,
    *,
    stage: _Stage | None,
    installing: bool,
    check: Callable[[str, Fingerprint], None] | None = None,
    inductor: _Stage | None = None,
    trust: Trust | None = None,
) -> Bundle:
    """Stream the archive once through every check; artifacts go to ``stage`` and
    compiled models' to ``inductor``, where given."""
    label = str(path)
    try:
        raw = path.open("rb")
    except OSError as e:
        raise BundleRejected(label, f"cannot read: {e}") from None
    with raw:
        size, most = os.fstat(raw.fileno()).st_size, _max_file_bytes(limits)
        if size > most:
            raise BundleRejected(
                label,
                f"the file is {size} bytes; limit {most} (max_total_bytes plus room for tar "
                "headers and gzip)",
            )
        hashed = tar_stream.Hashed(raw)
        gz = gzip.GzipFile(fileobj=hashed, mode="rb")
        reader = _Reader(
            label, limits, stage, installing=installing, check=check, inductor=inductor
        )
        reader.trust = trust or Trust()
        try:
            for info in tar_stream.members(gz, limits.max_header_bytes):
                reader.add(info, functools.partial(tar_stream.chunks, gz, info.name))
            tar_stream.tail(gz, hashed)
            sha256 = hashed.hexdigest()
        except tar_stream.TarRejected as e:
            raise BundleRejected(label, e.reason) from None
        bundle = reader.finish(path, sha256)
        bundle.manifest_sha256, bundle.signed_by = reader.manifest_sha256, reader.signed_by
        return bundle


def _max_file_bytes(limits: Limits) -> int:
    """The biggest file a bundle within ``limits`` can be: its members, each with its
    headers and padding, the tail, and what deflate adds to bytes it cannot compress."""
    per_member = limits.max_header_bytes + tarfile.BLOCKSIZE
    tar = limits.max_total_bytes + limits.max_members * per_member + 2 * tar_stream.TAIL_BYTES
    return tar + tar // 100


class _Reader:
    """Checks members in stream order against MANIFEST.json, which comes first."""

    def __init__(
        self,
        label: str,
        limits: Limits,
        stage: _Stage | None,
        *,
        installing: bool,
        check: Callable[[str, Fingerprint], None] | None,
        inductor: _Stage | None,
    ) -> None:
        self.label, self.limits, self.stage = label, limits, stage
        self.installing, self.check, self.inductor = installing, check, inductor
        self.manifest: dict[str, Any] | None = None
        self.listed: dict[str, tuple[str, int]] = {}  # name -> (sha256, size)
        self.seen: set[str] = set()
        self.count = 0
        self.values = 0  # JSON values in the entries so far
        self.entries: list[Entry] = []
        self.digests: dict[str, str] = {}  # fingerprint digest -> an entry member with it
        self.artifacts: list[str] = []
        self.indexes: list[str] = []
        self.blobs: list[str] = []
        self.named: set[str] = set()  # blob members the indexes so far name
        self.restores = bundle_inductor.Restores(limits.max_total_bytes)  # what indexes write
        self.trust = Trust()
        self.signature: Signature | None = None
        self.signed_by: str | None = None
        self.manifest_sha256 = ""

    def add(self, info: tarfile.TarInfo, data: Callable[[int], Iterator[bytes]]) -> None:
        """Check one member, then read its data through ``data(size)``."""
        self.count += 1
        if self.count > self.limits.max_members:
            raise self._reject(
                f"member {self.count} ('{short(info.name)}') is one too many; "
                f"limit {self.limits.max_members} members"
            )
        _check_name(self.label, info.name, self.limits.max_name_bytes)
        _check_type(self.label, info)
        if info.isdir():
            return
        if self.manifest is None:
            if info.name == bundle_signature.SIGNATURE and self.count == 1:
                self._read_signature(info, data)
            else:
                self._read_manifest(info, data)
            return
        sha, size = self._expected(info)
        if info.name.startswith(f"{ENTRIES}/"):
            self._read_entry(info.name, b"".join(self._hashed(info.name, sha, data(size))))
        elif bundle_inductor.is_index(info.name):
            self._read_index(info.name, b"".join(self._hashed(info.name, sha, data(size))))
        elif bundle_inductor.is_member(info.name):
            self._read_blob(info.name, sha, data(size))
        else:
            self._read_artifact(info.name, sha, data(size))

    def _reject(self, reason: str) -> BundleRejected:
        return BundleRejected(self.label, reason)

    def _expected(self, info: tarfile.TarInfo) -> tuple[str, int]:
        name = info.name
        if name in self.seen or name == MANIFEST:
            raise self._reject(f"member '{name}' appears twice")
        if name not in self.listed:
            raise self._reject(f"member '{name}' is not listed in {MANIFEST}")
        self.seen.add(name)
        sha, size = self.listed[name]
        if info.size != size:
            raise self._reject(f"member '{name}' is {info.size} bytes; {MANIFEST} lists {size}")
        return sha, size

    def _hashed(self, name: str, sha: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """``chunks`` passed on; after the last, a mismatch with ``sha`` rejects."""
        digest = hashlib.sha256()
        for chunk in chunks:
            digest.update(chunk)
            yield chunk
        if digest.hexdigest() != sha:
            raise self._reject(f"checksum mismatch for '{name}'")

    # -- the signature and the manifest

    def _read_signature(
        self, info: tarfile.TarInfo, data: Callable[[int], Iterator[bytes]]
    ) -> None:
        if info.size > bundle_signature.MAX_BYTES:
            raise self._reject(
                f"{bundle_signature.SIGNATURE} is {info.size} bytes; "
                f"limit {bundle_signature.MAX_BYTES}"
            )
        self.signature = bundle_signature.decode(self.label, b"".join(data(info.size)))
        self.signed_by = self.signature.key_id

    def _check_signature(self, text: bytes) -> None:
        """Before MANIFEST.json is parsed: refuse it unless the trust accepts its signature."""
        try:
            self.trust.check(MANIFEST, bundle_signature.DOMAIN, text, self.signature)
        except Untrusted as e:
            raise self._reject(e.reason) from None
        self.manifest_sha256 = _sha(text)

    def _read_manifest(self, info: tarfile.TarInfo, data: Callable[[int], Iterator[bytes]]) -> None:
        if info.name != MANIFEST:
            raise self._reject(
                f"no {MANIFEST} as the first member, or the second after "
                f"{bundle_signature.SIGNATURE} (found '{info.name}')"
            )
        limit = min(self.limits.max_manifest_bytes, self.limits.max_member_bytes)
        if info.size > limit:  # a negative size never gets here: tar_stream refuses it
            raise self._reject(f"{MANIFEST} is {info.size} bytes; limit {limit}")
        if info.size > self.limits.max_total_bytes:
            raise self._reject(
                f"members add up to more than the total limit {self.limits.max_total_bytes} bytes"
            )
        text = b"".join(data(info.size))
        self._check_signature(text)
        values = atomic.json_values(text)
        if values > self.limits.max_manifest_values:
            raise self._reject(
                f"{MANIFEST} has {values} JSON values; limit {self.limits.max_manifest_values}"
            )
        try:
            manifest = atomic.loads(text)
        except ValueError as e:
            raise self._reject(f"{MANIFEST} is not JSON ({why(e)})") from None
        self.listed = _check_manifest(self.label, manifest, self.limits, info.size)
        self.manifest = manifest
        if self.installing and self.stage is None and any(_is_artifact(n) for n in self.listed):
            raise self._reject("it carries Triton artifacts but no cache folder was given")
        if (
            self.installing
            and self.inductor is None
            and any(map(bundle_inductor.is_member, self.listed))
        ):
            raise self._reject(
                "it carries compiled models' artifacts but no inductor folder was given"
            )

    # -- entries and artifacts

    def _read_entry(self, name: str, text: bytes) -> None:
        values = atomic.json_values(text)
        self.values += values
        if values > self.limits.max_entry_values:
            raise self._reject(
                f"entry '{name}' has {values} JSON values; limit {self.limits.max_entry_values}"
            )
        if self.values > self.limits.max_entries_values:
            raise self._reject(
                f"entries up to '{name}' have {self.values} JSON values; "
                f"limit {self.limits.max_entries_values}"
            )
        try:
            entry = Entry.from_json(atomic.loads(text))
            entry.relpath()  # touches every fingerprint field the store will use
            digest = entry.fingerprint.digest()
        except (ValueError, RegistryError) as e:
            reason = str(e) if isinstance(e, RegistryError) else why(e)
            raise self._reject(f"entry '{name}': {reason}") from None
        if self.check is not None:
            self.check(f"entry {entry.relpath()}", entry.fingerprint)
        self.entries.append(entry)
        self.digests.setdefault(digest, name)

    def _read_index(self, name: str, text: bytes) -> None:
        values = atomic.json_values(text)
        if values > self.limits.max_index_values:
            raise self._reject(
                f"index '{name}' has {values} JSON values; limit {self.limits.max_index_values}"
            )
        try:
            index = bundle_inductor.check_index(name, text, self.listed)
            self.restores.add(name, index)  # bounded like the members: each path counted
        except RegistryError as e:
            raise self._reject(str(e)) from None
        fingerprint = Fingerprint.from_json(index["fingerprint"])
        if self.check is not None:
            self.check(f"compiled model index {name}", fingerprint)
        rel = name.removeprefix(bundle_inductor.PREFIX)
        if self.inductor is not None:
            self.inductor.write(self.label, rel, [text])
        self.indexes.append(rel)
        self.named |= bundle_inductor.named_blobs(index)
        self.digests.setdefault(fingerprint.digest(), name)

    def _read_blob(self, name: str, sha: str, chunks: Iterator[bytes]) -> None:
        rel = name.removeprefix(bundle_inductor.PREFIX)
        self._keep(self.inductor, rel, self._hashed(name, sha, chunks))
        self.blobs.append(rel)

    def _read_artifact(self, name: str, sha: str, chunks: Iterator[bytes]) -> None:
        rel = name.removeprefix(f"{TRITON_CACHE}/")
        self._keep(self.stage, rel, self._hashed(name, sha, chunks))
        self.artifacts.append(rel)

    def _keep(self, stage: _Stage | None, rel: str, hashed: Iterator[bytes]) -> None:
        if stage is None:
            for _ in hashed:  # verify only: hash and drop
                pass
        else:
            stage.write(self.label, rel, hashed)

    def finish(self, path: Path, sha256: str) -> Bundle:
        """After the last member: every listed member came, and the fingerprints agree."""
        if self.manifest is None:
            raise self._reject(f"no {MANIFEST}")
        missing = sorted(set(self.listed) - self.seen)
        if missing:
            raise self._reject(f"member '{missing[0]}' is listed but missing")
        orphan = bundle_inductor.check_blobs(self.listed, self.named)
        if orphan is not None:
            raise self._reject(f"blob '{orphan}' is named by no index")
        listed = {fp["digest"]: fp for fp in self.manifest["fingerprints"]}
        for digest, name in sorted(self.digests.items()):
            if digest not in listed:
                raise self._reject(
                    f"entry '{name}' has fingerprint {digest}, not listed in "
                    f"{MANIFEST} 'fingerprints'"
                )
        for digest in sorted(set(listed) - set(self.digests)):
            fp = listed[digest]
            raise self._reject(
                f"{MANIFEST} 'fingerprints' lists {short(digest)} ({short(fp['gpu'])} / "
                f"{short(fp['software'])}), which no entry or index has"
            )
        return Bundle(
            path, self.manifest, self.entries, self.artifacts, self.indexes, self.blobs, sha256
        )


def _check_name(label: str, name: str, max_bytes: int) -> None:
    parts = PurePosixPath(name).parts
    if name.startswith("/") or (parts and parts[0].endswith(":")) or "\\" in name:
        raise BundleRejected(label, f"member '{short(name)}' has an absolute path")
    if ".." in parts:
        raise BundleRejected(label, f"member '{short(name)}' has a '..' component")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise BundleRejected(label, f"member name {shown(name)} is not UTF-8") from None
    if any(c < " " for c in name):
        raise BundleRejected(label, f"member name {shown(name)} has a control character")
    if size > max_bytes:
        raise BundleRejected(
            label, f"member name '{short(name)}' is {size} bytes; limit {max_bytes}"
        )
    longest = max((len(part.encode()) for part in parts), default=0)
    if longest > MAX_PART_BYTES:  # no file system takes it: installing it would fail
        raise BundleRejected(
            label,
            f"member '{short(name)}' has a path component of {longest} bytes; "
            f"limit {MAX_PART_BYTES}",
        )
    if not parts or PurePosixPath(name).as_posix() != name:
        raise BundleRejected(label, f"member '{short(name)}' is not a normalised relative path")


def _check_type(label: str, info: tarfile.TarInfo) -> None:
    name = info.name
    if info.issym() or info.islnk():
        raise BundleRejected(label, f"member '{name}' is a link to '{short(info.linkname)}'")
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE) or info.sparse:
        raise BundleRejected(label, f"member '{name}' is a device, fifo or other special file")


def _is_artifact(name: str) -> bool:
    return name.startswith(f"{TRITON_CACHE}/")


def _check_manifest(
    label: str, manifest: Any, limits: Limits, manifest_size: int
) -> dict[str, tuple[str, int]]:
    """The manifest's fields, and its members as ``{name: (sha256, size)}`` within limits."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleRejected(label, f"{MANIFEST} 'format' is not '{FORMAT}'")
    if manifest.get("schema") != SCHEMA:
        raise BundleRejected(
            label,
            f"unknown schema version {shown(manifest.get('schema'))}; this version reads {SCHEMA}",
        )
    for key in ("name", "version", "created", "members", "fingerprints"):
        if key not in manifest:
            raise BundleRejected(label, f"{MANIFEST} has no '{key}'")
    for key in ("name", "version"):
        if not isinstance(manifest[key], str) or not manifest[key]:
            raise BundleRejected(
                label,
                f"{MANIFEST} '{key}' is {shown(manifest[key])}; not a non-empty string",
            )
    _check_fingerprint_list(label, manifest["fingerprints"])
    return _check_listed(label, manifest["members"], limits, manifest_size)


def _check_fingerprint_list(label: str, fingerprints: Any) -> None:
    if not isinstance(fingerprints, list):
        raise BundleRejected(label, f"{MANIFEST} 'fingerprints' is not a list")
    for i, fp in enumerate(fingerprints):
        if not isinstance(fp, dict) or not all(
            isinstance(fp.get(k), str) for k in ("digest", "gpu", "software")
        ):
            raise BundleRejected(
                label,
                f"{MANIFEST} 'fingerprints' item {i} is {shown(fp)}; expected an object "
                "with string 'digest', 'gpu' and 'software'",
            )


def _check_listed(
    label: str, members: Any, limits: Limits, manifest_size: int
) -> dict[str, tuple[str, int]]:
    if not isinstance(members, dict):
        raise BundleRejected(label, f"{MANIFEST} 'members' is not an object")
    if len(members) >= limits.max_members:  # MANIFEST.json is a member too
        raise BundleRejected(
            label, f"{MANIFEST} lists {len(members)} members; limit {limits.max_members}"
        )
    listed: dict[str, tuple[str, int]] = {}
    total, entries = manifest_size, 0
    for name, item in members.items():
        listed[name] = _listed_member(label, name, item, limits)
        total += listed[name][1]
        entries += 0 if _is_artifact(name) or bundle_inductor.is_member(name) else listed[name][1]
    if total > limits.max_total_bytes:
        raise BundleRejected(
            label, f"members add up to more than the total limit {limits.max_total_bytes} bytes"
        )
    if entries > limits.max_entries_bytes:
        raise BundleRejected(
            label, f"entries add up to {entries} bytes; limit {limits.max_entries_bytes}"
        )
    return listed


def _listed_member(label: str, name: str, item: Any, limits: Limits) -> tuple[str, int]:
    """The sha256 and size the manifest lists for the member ``name``, each checked, and
    the size against the member's limit."""
    _check_name(label, name, limits.max_name_bytes)
    what, limit = _member_limit(label, name, limits)
    sha = item.get("sha256") if isinstance(item, dict) else None
    size = item.get("size") if isinstance(item, dict) else None
    if not isinstance(sha, str) or not SHA256.fullmatch(sha):
        raise BundleRejected(label, f"{MANIFEST} lists '{name}' without a sha256 (64 hex digits)")
    if bundle_inductor.is_member(name):
        try:
            bundle_inductor.check_listed(name, sha)
        except ValueError as e:
            raise BundleRejected(label, f"member '{name}' {e}") from None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BundleRejected(label, f"{MANIFEST} lists '{name}' without a size (an int >= 0)")
    if size > limit:
        raise BundleRejected(label, f"{what} '{name}' is {size} bytes; limit {limit}")
    return sha, size


def _member_limit(label: str, name: str, limits: Limits) -> tuple[str, int]:
    """What the member ``name`` is, as a message calls it, and the most bytes it may
    hold; a name under none of the bundle's folders rejects the bundle."""
    if _is_artifact(name):
        return _artifact_limit(label, name, limits)
    if name.startswith(f"{ENTRIES}/"):
        return "member", min(limits.max_entry_bytes, limits.max_member_bytes)
    if bundle_inductor.is_index(name):
        return "index", min(limits.max_member_bytes, limits.max_index_bytes)
    if bundle_inductor.is_member(name):
        return "member", limits.max_member_bytes
    raise BundleRejected(
        label,
        f"member '{name}' is not under {ENTRIES}/, {TRITON_CACHE}/ or {bundle_inductor.PREFIX}",
    )


def _artifact_limit(label: str, name: str, limits: Limits) -> tuple[str, int]:
    """:func:`_member_limit` of an artifact, once its name is ``triton-cache/<hash>/<file>``
    with a Triton cache folder and no dot file."""
    parts = PurePosixPath(name).parts
    if len(parts) != 3:
        raise BundleRejected(label, f"artifact '{name}' is not triton-cache/<hash>/<file>")
    if not TRITON_CACHE_KEY.fullmatch(parts[1]):  # never .bundle-*, "." or ".."
        raise BundleRejected(
            label,
            f"artifact '{name}': {shown(parts[1])} is not a Triton cache folder name "
            f"({TRITON_CACHE_KEY.pattern})",
        )
    if parts[2].startswith("."):  # Triton's temp files and our own start with a dot
        raise BundleRejected(label, f"artifact '{name}' has a file name that starts with a dot")
    if is_group(parts[2]):
        return "Triton group file", min(limits.max_member_bytes, limits.max_group_bytes)
    return "member", limits.max_member_bytes


# ---- install -------------------------------------------------------------------------


class _Stage:
    """Artifacts wait in ``<cache>/.bundle-*`` (same file system: a rename moves each)
    until the store holds the entries; on failure the folder goes, and so do the cache
    folders it had to create."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.root: Path | None = None
        self._made: list[Path] = []  # cache folders this install created, deepest first
        self.moved: list[str] = []  # artifacts committed into the cache

    def write(self, label: str, rel: str, chunks: Iterable[bytes]) -> None:
        """Write an artifact from ``chunks``; the bundle's own faults reject, and so does
        any failure of the file system (a path too long, a full disk)."""
        final = self.cache / rel
        try:
            if final.is_dir() or (final.parent.exists() and not final.parent.is_dir()):
                raise BundleRejected(label, f"artifact '{rel}' cannot replace what is at {final}")
            target = self._folder() / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("xb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise BundleRejected(
                label, f"cannot stage artifact '{rel}' in {self.root}: {e}"
            ) from None

    def _folder(self) -> Path:
        if self.root is None:
            missing = itertools.takewhile(
                lambda p: not p.exists(), [self.cache, *self.cache.parents]
            )
            self._made = list(missing)
            self.cache.mkdir(parents=True, exist_ok=True)
            self.root = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.cache))
        return self.root

    def commit(self, artifacts: list[str]) -> None:
        """Move every staged artifact into the cache, each with one rename. Called after
        the store swap, so it never raises: one that cannot move is logged and left out
        (Triton compiles it again)."""
        assert self.root is not None  # only called when artifacts were staged
        folders, failed = set(), []
        for rel in artifacts:
            target = self.cache / rel
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.root / rel, target)
            except OSError as e:
                failed.append(f"{rel}: {e}")
                continue
            self.moved.append(rel)
            folders.add(target.parent)
        for folder in sorted(folders):
            atomic.fsync_dir(folder)
        if failed:
            log.error(
                "%d of %d artifacts not moved into the cache %s (Triton compiles them "
                "again); first: %s",
                len(failed),
                len(artifacts),
                self.cache,
                failed[0],
            )

    def relocate_groups(self) -> None:
        """Point the group files this install moved in at the folder they now live in."""
        groups = [self.cache / rel for rel in self.moved if is_group(PurePosixPath(rel).name)]
        try:
            relocate(self.cache, groups)
        except OSError as e:  # after the swap: a miss costs a recompile, not the install
            log.error("group files in %s not relocated (Triton compiles again): %s", self.cache, e)

    def discard(self, *, failed: bool) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        for folder in self._made if failed else ():
            with contextlib.suppress(OSError):
                folder.rmdir()


def install(
    path: Path,
    store: Store,
    *,
    expect: Fingerprint | None,
    policy: MatchPolicy = MatchPolicy.EXACT,
    force: bool = False,
    triton_cache: Path | None = None,
    inductor: Path | None = None,
    trust: Trust | None = None,
    **limits: int,
) -> dict[str, Any]:
    """Verify ``path``, then merge it into ``store`` as one new generation: all or nothing.
    A bundle whose manifest the current generation installed already makes none: its
    info is that generation's, with ``unchanged`` true.

    ``expect``: the fingerprint of the machines this store serves; entries and indexes
    that do not match it under ``policy`` reject the bundle unless ``force``. ``None``
    skips the check. Artifacts go to ``triton_cache`` (the volume's copy of
    TRITON_CACHE_DIR), compiled models' to ``inductor`` (the volume's family), only
    after the store install succeeded. ``trust``: the keys it must be signed by (see
    :func:`verify`). ``limits``: fields of :class:`Limits` to change.
    """
    checked = Limits(**limits)
    stages = {
        "triton": _Stage(triton_cache) if triton_cache is not None else None,
        "inductor": _Stage(inductor) if inductor is not None else None,
    }
    check = None
    if expect is not None and not force:
        check = _fingerprint_check(str(path), expect, policy)
    try:
        info = _merge(path, store, checked, stages, check, trust)
    except BaseException:
        _discard(stages, failed=True)
        raise
    _discard(stages, failed=False)
    if stages["triton"] is not None:
        stages["triton"].relocate_groups()
    return info


def _merge(
    path: Path,
    store: Store,
    limits: Limits,
    stages: dict[str, _Stage | None],
    check: Callable[[str, Fingerprint], None] | None,
    trust: Trust | None,
) -> dict[str, Any]:
    """Read the bundle at ``path`` into ``stages``, then install its entries in ``store``
    as one generation; the staged files move in after the swap."""
    bundle = _read(
        path,
        limits,
        stage=stages["triton"],
        installing=True,
        check=check,
        inductor=stages["inductor"],
        trust=trust,
    )
    same = _installed_already(store, bundle)
    if same is not None:
        return same
    previous = None
    inductor = stages["inductor"]
    if inductor is not None and bundle.indexes:  # under the store's lock
        previous = functools.partial(bundle_inductor.keep_previous, inductor.cache, bundle.indexes)
    return store.install(
        bundle.entries,
        record=_record(bundle),
        after_swap=functools.partial(_commit, bundle, stages),
        before_seal=previous,
    )


def _discard(stages: dict[str, _Stage | None], *, failed: bool) -> None:
    """Remove every stage's folder; ``failed``: the cache folders it made go too."""
    for stage in stages.values():
        if stage is not None:
            stage.discard(failed=failed)


def _commit(bundle: Bundle, stages: dict[str, _Stage | None]) -> None:
    """After the swap: artifacts into the Triton cache; blobs, then the indexes that name
    them, into the compiled models' family."""
    if stages["triton"] is not None and bundle.artifacts:
        stages["triton"].commit(bundle.artifacts)
    stage = stages["inductor"]
    if stage is not None and (bundle.blobs or bundle.indexes):
        stage.commit(bundle.blobs)
        stage.commit(bundle_inductor.whole_indexes(stage.cache, stage.root, bundle.indexes))


def rollback(store: Store, *, inductor: Path | None = None) -> dict[str, Any]:
    """Undo the latest bundle install not yet undone (``Store.rollback``), and put back
    the compiled models' indexes it replaced in the family at ``inductor``."""

    def undo(record: Record) -> None:
        if record.extra.get(bundle_inductor.RECORD_KEY) and inductor is None:
            log.warning(
                "rollback of %s: its compiled models' indexes stay (no inductor folder given)",
                record.id,
            )
        elif inductor is not None:
            bundle_inductor.undo(inductor, record)

    return store.rollback(after_swap=undo)


def _installed_already(store: Store, bundle: Bundle) -> dict[str, Any] | None:
    """The current generation's info if it is the install of ``bundle``'s manifest."""
    record = store.record()
    if record is None or record.kind != "install":
        return None
    if Generation(record).bundle.get("manifest_sha256") != bundle.manifest_sha256:
        return None
    log.info("bundle %s is installed already as %s: no new generation", bundle.path, record.id)
    return {**record.to_json(), "unchanged": True}


def _record(bundle: Bundle) -> dict[str, Any]:
    return {
        "bundle": {
            "name": bundle.name,
            "version": bundle.version,
            "sha256": bundle.sha256,
            "manifest_sha256": bundle.manifest_sha256,
            "signed_by": bundle.signed_by,
            "file": bundle.path.name,
        },
        "entries": len(bundle.entries),
        "artifacts": len(bundle.artifacts),
        "models": len(bundle.indexes),
    }


def _fingerprint_check(
    label: str, expect: Fingerprint, policy: MatchPolicy
) -> Callable[[str, Fingerprint], None]:
    """Reject an entry or index made for another platform as soon as it is read."""

    def check(what: str, fingerprint: Fingerprint) -> None:
        mismatch = expect.with_kernel(fingerprint.kernel_hash).mismatches(fingerprint, policy)
        if mismatch:
            fields = ", ".join(f"{k} ({b!r}, here {a!r})" for k, (a, b) in sorted(mismatch.items()))
            raise BundleRejected(
                label,
                f"{what} was made for another platform under policy '{policy.value}': "
                f"{fields}; pass --force (force=True) to install anyway",
            )

    return check


def installed(store: Store) -> list[Generation]:
    """The store's kept generations that installed or rolled back a bundle, oldest first."""
    return [g for g in store.generations() if g.record.kind in ("install", "rollback")]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
