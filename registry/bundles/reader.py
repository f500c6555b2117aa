"""Reading a bundle: one pass over the archive as a stream, every member checked against
MANIFEST.json (which comes first, after its signature) before its bytes are read, each
cache family's members handed to the family whose folder holds them
(``registry.families.bundle_parts``). What a bundle is (:class:`Bundle`, :class:`Limits`, the
names of its parts) is defined here; :mod:`registry.bundles.bundle` creates, verifies, installs
and rolls back (see its docstring for the format and the limits).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tarfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from registry.bundles import signature as bundle_signature
from registry.bundles import tar_stream
from registry.caches.inductor_cache import MAX_INDEX_VALUES
from registry.caches.triton_cache import MAX_GROUP_BYTES
from registry.core import atomic
from registry.core.entry import Entry
from registry.core.errors import BundleRejected, RegistryError, short, shown, why
from registry.core.fingerprint import Fingerprint
from registry.core.patterns import SHA256
from registry.families.bundle_indexed import Restores
from registry.families.bundle_parts import BundlePart, Held, PartReader
from registry.families.staging import Stage
from registry.trust.signing import Signature, Trust, Untrusted

FORMAT = "triton-warmup-bundle"
SCHEMA = 1
MANIFEST = "MANIFEST.json"
ENTRIES = "entries"
MAX_MEMBER_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 2 * 2**30
MAX_PART_BYTES = 255  # a file name on Linux file systems (NAME_MAX)
MAX_SEQUENCE = 2**63 - 1  # what every JSON reader and a signed 64-bit integer hold


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
    parts: dict[str, Held] = field(default_factory=dict)  # family -> its files; bytes on disk
    sha256: str = ""
    manifest_sha256: str = ""  # what it holds: the same whether signed or not
    signed_by: str | None = None  # the key id of its signature, checked or not
    vouched: bool = False  # its signature verified against a key the trust holds

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def sequence(self) -> int:
        """Its place among the bundles of its name (``registry.bundles.versions``); 0 for
        a bundle made before bundles had one."""
        return int(self.manifest.get("sequence", 0))


class Parts:
    """Each bundled family's part, by the family's name (handed in by the caller, so
    that the reader names no family): which part owns a member. Each owns a folder of
    its own: a bundle member belongs to one part, or to none and is refused."""

    def __init__(self, parts: Mapping[str, BundlePart]) -> None:
        prefixes = [part.prefix for part in parts.values()]
        assert all(p.endswith("/") and p != f"{ENTRIES}/" for p in prefixes), prefixes
        assert not any(a != b and b.startswith(a) for a in prefixes for b in prefixes), prefixes
        assert len(set(prefixes)) == len(prefixes), prefixes
        self.by_name = dict(parts)

    def items(self) -> Iterator[tuple[str, BundlePart]]:
        return iter(self.by_name.items())

    def values(self) -> list[BundlePart]:
        return list(self.by_name.values())

    def owner(self, label: str, name: str) -> BundlePart:
        """The part whose folder holds ``name``; a name under none rejects the bundle."""
        for part in self.by_name.values():
            if part.owns(name):
                return part
        folders = ", ".join([f"{ENTRIES}/", *(p.prefix for p in self.by_name.values())])
        raise BundleRejected(label, f"member '{name}' is not under {folders}")


# ---- verify --------------------------------------------------------------------------


def read(
    path: Path,
    limits: Limits,
    *,
    parts: Parts,
    stages: Mapping[str, Stage] | None,
    check: Callable[[str, Fingerprint], None] | None = None,
    trust: Trust | None = None,
) -> tuple[Bundle, Reader]:
    """Stream the archive once through every check; each family's files (its part of
    ``parts``) go to its stage in ``stages`` (install; None: verify only). The bundle,
    and the reader with each family's part of it (what an install commits)."""
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
        reader = Reader(label, limits, stages, parts=parts, check=check)
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
        bundle.vouched = reader.vouched
        return bundle, reader


def _max_file_bytes(limits: Limits) -> int:
    """The biggest file a bundle within ``limits`` can be: its members, each with its
    headers and padding, the tail, and what deflate adds to bytes it cannot compress."""
    per_member = limits.max_header_bytes + tarfile.BLOCKSIZE
    tar = limits.max_total_bytes + limits.max_members * per_member + 2 * tar_stream.TAIL_BYTES
    return tar + tar // 100


class Reader:
    """Checks members in stream order against MANIFEST.json, which comes first."""

    def __init__(
        self,
        label: str,
        limits: Limits,
        stages: Mapping[str, Stage] | None,
        *,
        parts: Parts,
        check: Callable[[str, Fingerprint], None] | None,
    ) -> None:
        self.label, self.limits, self.stages, self.check = label, limits, stages, check
        self.installing = stages is not None
        budget = Restores(limits.max_total_bytes)  # what all the parts restore, together
        self.bundle_parts = parts
        self.parts: dict[str, PartReader] = {
            name: part.reader(label, limits, (stages or {}).get(name), budget)
            for name, part in parts.items()
        }
        self.manifest: dict[str, Any] | None = None
        self.listed: dict[str, tuple[str, int]] = {}  # name -> (sha256, size)
        self.seen: set[str] = set()
        self.count = 0
        self.values = 0  # JSON values in the entries so far
        self.entries: list[Entry] = []
        self.digests: dict[str, str] = {}  # fingerprint digest -> an entry member with it
        self.trust = Trust()
        self.signature: Signature | None = None
        self.signed_by: str | None = None
        self.vouched = False
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
            return
        part = self._owner(info.name)
        part.read(info.name, sha, data(size))

    def _owner(self, name: str) -> PartReader:
        """The reader of the family whose folder holds ``name`` (listed, so one does)."""
        return next(r for r in self.parts.values() if r.part.owns(name))

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

    def _check_signature(self, text: bytes, *, code: bool) -> None:
        """Refuse MANIFEST.json unless the trust accepts its signature: before it is
        parsed as data (``code`` False), and once its members are known, for the code
        they carry (with no trusted key, only a bundle of tuned entries goes unsigned)."""
        domain = bundle_signature.DOMAIN
        try:
            self.trust.check(MANIFEST, domain, text, self.signature, code=code)
        except Untrusted as e:
            raise self._reject(e.reason) from None
        self.manifest_sha256 = _sha(text)
        # a known key's signature that did not verify raised above: this one verified
        self.vouched = self.signature is not None and self.signature.key_id in self.trust.keys_for(
            domain
        )

    def _carries_code(self) -> bool:
        """Whether a listed member belongs to a family whose files are run."""
        return any(
            part.carries_code and any(map(part.owns, self.listed))
            for part in self.bundle_parts.values()
        )

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
        self._check_signature(text, code=False)
        values = atomic.json_values(text)
        if values > self.limits.max_manifest_values:
            raise self._reject(
                f"{MANIFEST} has {values} JSON values; limit {self.limits.max_manifest_values}"
            )
        try:
            manifest = atomic.loads(text)
        except ValueError as e:
            raise self._reject(f"{MANIFEST} is not JSON ({why(e)})") from None
        self.listed = _check_manifest(
            self.label, manifest, self.limits, info.size, self.bundle_parts
        )
        if self._carries_code():
            self._check_signature(text, code=True)
        self.manifest = manifest
        for reader in self.parts.values():
            reader.begin(self.listed, self._hashed, self.check)
        for reader in self.parts.values():
            if self.installing and reader.stage is None and any(map(reader.part.owns, self.listed)):
                raise self._reject(
                    f"it carries {reader.part.what} but no {reader.part.option} folder was given"
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

    def finish(self, path: Path, sha256: str) -> Bundle:
        """After the last member: every listed member came, and the fingerprints agree."""
        if self.manifest is None:
            raise self._reject(f"no {MANIFEST}")
        missing = sorted(set(self.listed) - self.seen)
        if missing:
            raise self._reject(f"member '{missing[0]}' is listed but missing")
        for reader in self.parts.values():
            reader.finish()
            for digest, name in reader.digests.items():
                self.digests.setdefault(digest, name)
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
        parts = {name: reader.held() for name, reader in self.parts.items()}
        return Bundle(path, self.manifest, self.entries, parts, sha256)


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


def _check_manifest(
    label: str, manifest: Any, limits: Limits, manifest_size: int, parts: Parts
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
    sequence = manifest.get("sequence", 0)
    if not isinstance(sequence, int) or isinstance(sequence, bool):
        raise BundleRejected(label, f"{MANIFEST} 'sequence' is {shown(sequence)}; not an int")
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise BundleRejected(
            label, f"{MANIFEST} 'sequence' is {shown(sequence)}; expected 0 to {MAX_SEQUENCE}"
        )
    _check_fingerprint_list(label, manifest["fingerprints"])
    return _check_listed(label, manifest["members"], limits, manifest_size, parts)


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
    label: str, members: Any, limits: Limits, manifest_size: int, parts: Parts
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
        listed[name] = _listed_member(label, name, item, limits, parts)
        total += listed[name][1]
        entries += listed[name][1] if name.startswith(f"{ENTRIES}/") else 0
    if total > limits.max_total_bytes:
        raise BundleRejected(
            label, f"members add up to more than the total limit {limits.max_total_bytes} bytes"
        )
    if entries > limits.max_entries_bytes:
        raise BundleRejected(
            label, f"entries add up to {entries} bytes; limit {limits.max_entries_bytes}"
        )
    return listed


def _listed_member(
    label: str, name: str, item: Any, limits: Limits, parts: Parts
) -> tuple[str, int]:
    """The sha256 and size the manifest lists for the member ``name``, each checked, and
    the size against the member's limit."""
    _check_name(label, name, limits.max_name_bytes)
    part = None if name.startswith(f"{ENTRIES}/") else parts.owner(label, name)
    if part is None:
        what, limit = "member", min(limits.max_entry_bytes, limits.max_member_bytes)
    else:
        what, limit = part.limit(label, name, limits)
    sha = item.get("sha256") if isinstance(item, dict) else None
    size = item.get("size") if isinstance(item, dict) else None
    if not isinstance(sha, str) or not SHA256.fullmatch(sha):
        raise BundleRejected(label, f"{MANIFEST} lists '{name}' without a sha256 (64 hex digits)")
    if part is not None:
        part.check_sha(label, name, sha)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BundleRejected(label, f"{MANIFEST} lists '{name}' without a size (an int >= 0)")
    if size > limit:
        raise BundleRejected(label, f"{what} '{name}' is {size} bytes; limit {limit}")
    return sha, size


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
