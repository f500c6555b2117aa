"""Bundles: one archive of registry entries and, optionally, each cache family's files.

Archive (tar, gzip) members, MANIFEST.json first (after SIGNATURE.json, if signed)::

    SIGNATURE.json                    Ed25519 signature of MANIFEST.json's bytes: bundle_signature
    MANIFEST.json                     format, schema, name, version, sequence, created,
                                      fingerprints covered, sha256 and size of every member
    entries/<kernel>/<gpu>/<software>/<shape>.json
    <family folder>/...               each cache family's files
                                      (``registry.families.bundle_parts``):
    triton-cache/<hash>/<artifact>                         Triton's kernels
    inductor/models/<model>/<gpu>/<software>/<key>.json    compiled models (bundle_indexed)
    inductor/blobs/<sha[:2]>/<sha256>
    caches/models/<name>/<gpu>/<software>/<key>.json       declared folders (bundle_indexed)
    caches/blobs/<sha[:2]>/<sha256>

The entries are the store's own; for every other member this module asks the family
whose folder holds it (``registry.families``: each family's ``bundled`` part), and names
none.

Trust (:class:`registry.trust.signing.Trust`): where trusted keys are configured, ``verify``
and ``install`` refuse a bundle that is unsigned, signed by an unknown key, or whose
signature does not verify, as soon as MANIFEST.json is read, before it is parsed and
before any other member is read. The signature covers MANIFEST.json, which lists the
sha256 of every other member, so it vouches for every byte installed.

``verify`` and ``install`` read the archive once, as a stream, in bounded memory
(:mod:`registry.bundles.tar_stream`): each limit is checked before the bytes it guards are read
(a header's size before its content, a member's size before its data), every member is
hashed in 1 MiB pieces, and artifacts go to a staging folder on disk, never into memory.
The limits (:class:`Limits`; each is also a keyword of ``verify`` and ``install``):

- the file no bigger than a bundle within these limits can be (checked before reading);
- at most 32,768 members, each name at most 1,024 bytes (each part at most 255), under
  ``entries/``, ``triton-cache/<hash>/`` (``<hash>``: 1 to 128 of ``A-Za-z0-9_=-``; an
  artifact's name never starts with a dot), ``inductor/`` or ``caches/``; regular files
  and folders only;
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

Versions (:mod:`registry.bundles.versions`): ``sequence``, in the signed MANIFEST.json,
orders the bundles of one name; ``install`` refuses one older than the highest of its
name installed, or the same sequence with other content, unless ``allow_downgrade``.

``install`` is all or nothing: it parses every entry and computes its path, checks the
fingerprints (unless ``force``), stages each family's files in its folder's
``.bundle-*`` (``<triton_cache>/.bundle-*``, ...), swaps in a new store generation in one
rename, and only then, still under the store's lock, moves the artifacts into place. On
any failure before the swap it removes the staging folder and leaves the cache and the
store as they were; a stage a killed install left is removed by the next install into
the same folders (:mod:`registry.families.staging`: never one a live install uses).
After the swap an artifact that cannot move, or a group file that cannot be rewritten,
is logged: it costs a recompile, not the install. :func:`rollback` undoes an install,
compiled models' indexes included.
"""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from registry import families
from registry.bundles import signature as bundle_signature
from registry.bundles import versions
from registry.bundles.reader import (
    ENTRIES,
    FORMAT,
    MANIFEST,
    MAX_MEMBER_BYTES,
    MAX_PART_BYTES,
    MAX_SEQUENCE,
    MAX_TOTAL_BYTES,
    SCHEMA,
    Bundle,
    Limits,
    Parts,
    read,
)
from registry.bundles.tar_stream import CHUNK
from registry.caches.triton_cache import remove_stale_temp_files
from registry.core import atomic
from registry.core.entry import Entry, now_iso
from registry.core.errors import BadInput, BundleRejected, RegistryError
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.core.volume import Volume
from registry.families import staging
from registry.families.bundle_parts import PartReader
from registry.families.staging import Stage
from registry.storage.generations import Generation, Record
from registry.storage.store import Store
from registry.trust.signing import Signature, SigningKey, Trust

log = logging.getLogger(__name__)
_sequence_lock = threading.Lock()
_last_sequence = 0  # the last default sequence this process gave (_next_sequence)
__all__ = [
    "FORMAT", "MANIFEST", "MAX_MEMBER_BYTES", "MAX_PART_BYTES", "MAX_TOTAL_BYTES", "SCHEMA",
    "Bundle", "Limits", "create", "describe", "install", "installed",
    "on_volume", "remove_stale_stages", "rollback", "sign", "verify",
]  # fmt: skip


# ---- create ------------------------------------------------------------------------


def create(
    out: Path,
    *,
    name: str,
    version: str,
    entries: Iterable[Entry],
    roots: Mapping[str, Path] | None = None,
    only: str | None = None,
    signer: SigningKey | None = None,
    sequence: int | None = None,
) -> dict[str, Any]:
    """Write a bundle of ``entries`` and of each cache family's files in its folder of
    ``roots`` (family name -> folder: ``registry.families``; of the thing named ``only``,
    for a keyed family, if given) to ``out``, signed by ``signer`` if given.

    ``sequence``: its place among the bundles named ``name``, which an install never
    lets go backwards (:mod:`registry.bundles.versions`); default: the creation time in
    milliseconds. Artifacts are hashed, then copied, in pieces; they must not change
    meanwhile."""
    if not name or not version:
        raise RegistryError(f"Bundle needs a name and a version; got {name!r} and {version!r}.")
    if sequence is not None and not 0 <= sequence <= MAX_SEQUENCE:
        raise RegistryError(f"Bundle sequence {sequence} is out of range 0 to {MAX_SEQUENCE}.")
    members, fingerprints = _gather(entries, dict(roots or {}), only)
    if not members:
        raise RegistryError(f"Bundle '{name}' would be empty: no entries and no artifacts.")
    listed = {p: _summary(src) for p, src in sorted(members.items())}
    _check_blob_names(members, listed)
    manifest = {
        "format": FORMAT,
        "schema": SCHEMA,
        "name": name,
        "version": version,
        "sequence": _next_sequence() if sequence is None else sequence,
        "created": now_iso(),
        "fingerprints": [fingerprints[k] for k in sorted(fingerprints)],
        "members": listed,
    }
    text = atomic.dumps(manifest).encode()
    signature = None if signer is None else signer.sign(bundle_signature.DOMAIN, text)
    _write_archive(out, text, members, listed, signature)
    return manifest


def _next_sequence() -> int:
    """The time in milliseconds, past the last one this process gave: two bundles made in
    the same millisecond still come in the order they were made."""
    global _last_sequence
    with _sequence_lock:
        _last_sequence = max(time.time_ns() // 1_000_000, _last_sequence + 1)
        return _last_sequence


def sign(path: Path, key: SigningKey, *, out: Path | None = None) -> Bundle:
    """Verify the unsigned bundle at ``path``, then sign it with ``key`` into ``out``
    (default: in place); the signed bundle, verified against ``key``."""
    checked = verify(path, trust=Trust(allow_unsigned=True))  # unsigned: what it will sign
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


def bundled_parts() -> Parts:
    """Every family's part of a bundle (``registry.families``: each family's ``bundled``),
    in the families' order."""
    return Parts({f.name: f.bundled for f in families.every() if f.bundled is not None})


def describe(members: Iterable[str], *, sep: str = ", ") -> str:
    """What a bundle's members are, family by family: "3 artifacts, 1 compiled model
    indexes (3 files)"."""
    names = list(members)
    parts = bundled_parts().values()
    return sep.join(part.describe([n for n in names if part.owns(n)]) for part in parts)


def on_volume(volume: Path) -> dict[str, Path]:
    """Every family's folder on the volume at ``volume``."""

    paths = Volume(volume)
    found = {f.name: f.volume_root(paths) for f in families.every() if f.bundled is not None}
    return {name: root for name, root in found.items() if root is not None}


def remove_stale_stages(volume: Path) -> int:
    """What killed installs and copies left in every family's folder on the volume at
    ``volume`` (``.bundle-*`` stages, ``.tmp-*`` files); how many were removed."""
    return _remove_stale(on_volume(volume))


def _remove_stale(roots: Mapping[str, Path]) -> int:
    """Killed installs' stages in each family folder of ``roots`` (never one a live
    install uses: ``registry.families.staging``) and killed copies' old temp files."""
    removed = 0
    for root in roots.values():
        try:
            removed += staging.remove_stale_stages(root) + remove_stale_temp_files(root)
        except OSError as e:  # a clean-up: the install says what is wrong with the folder
            log.warning("stale stages in %s not removed: %s", root, e)
    return removed


def _gather(
    entries: Iterable[Entry], roots: Mapping[str, Path], only: str | None
) -> tuple[dict[str, bytes | Path], dict[str, dict[str, Any]]]:
    """The bundle's members by name (an entry's bytes, or the file to copy), and the
    fingerprints they were made for, each described, by digest."""
    members: dict[str, bytes | Path] = {}
    fingerprints: dict[str, dict[str, Any]] = {}
    for entry in entries:
        members[f"{ENTRIES}/{entry.relpath().as_posix()}"] = atomic.dumps(entry.to_json()).encode()
        fingerprints[entry.fingerprint.digest()] = _describe(entry.fingerprint)
    found = 0
    for name, part in bundled_parts().items():
        if name not in roots:
            continue
        packed = part.pack(roots[name], only=only)
        members.update(packed.members)
        fingerprints.update({fp.digest(): _describe(fp) for fp in packed.fingerprints})
        found += packed.indexes
    if only is not None and not found:
        where = ", ".join(str(path) for path in roots.values())
        raise BadInput(f"no artifacts of model {only} are stored in {where}")  # a name given
    return members, fingerprints


def _check_blob_names(
    members: Mapping[str, bytes | Path], listed: Mapping[str, dict[str, Any]]
) -> None:
    """A blob is named by its hash: one that hashed to another name changed in its
    family, and a bundle must not carry it."""
    parts = bundled_parts().values()  # once: each call finds the families again
    for member, item in listed.items():
        blob = any(part.owns(member) and part.is_blob(member) for part in parts)
        if blob and PurePosixPath(member).name != item["sha256"]:
            raise RegistryError(
                f"{members[member]!s} no longer hashes to its name: the family is damaged "
                "(a restore quarantines it; the next warm stores it again)"
            )


def _describe(fp: Fingerprint) -> dict[str, Any]:
    return {"digest": fp.digest(), "gpu": fp.gpu_slug(), "software": fp.software_slug()}


def _summary(src: bytes | Path) -> dict[str, Any]:
    if isinstance(src, bytes):
        return {"sha256": hashlib.sha256(src).hexdigest(), "size": len(src)}
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


def verify(path: Path, *, trust: Trust | None = None, **limits: int) -> Bundle:
    """Read and check the whole bundle; raise :class:`BundleRejected` naming the first fault.

    ``trust``: the keys it must be signed by (default: trust not configured, any
    signature is only decoded). ``limits``: fields of :class:`Limits` to change, e.g.
    ``max_member_bytes=2**20``."""
    return read(path, Limits(**limits), parts=bundled_parts(), stages=None, trust=trust)[0]


# ---- install -------------------------------------------------------------------------


def install(
    path: Path,
    store: Store,
    *,
    expect: Fingerprint | None,
    policy: MatchPolicy = MatchPolicy.EXACT,
    force: bool = False,
    roots: Mapping[str, Path] | None = None,
    trust: Trust | None = None,
    allow_downgrade: bool = False,
    **limits: int,
) -> dict[str, Any]:
    """Verify ``path``, then merge it into ``store`` as one new generation: all or nothing.
    A bundle whose manifest the current generation installed already makes none: its
    info is that generation's, with ``unchanged`` true. A bundle older than the highest
    of its name installed, or the same sequence with other content, is rejected unless
    ``allow_downgrade`` (:mod:`registry.bundles.versions`).

    ``expect``: the fingerprint of the machines this store serves; entries and indexes
    that do not match it under ``policy`` reject the bundle unless ``force``. ``None``
    skips the check. Each family's files go to its folder in ``roots`` (family name ->
    the volume's folder of it: :func:`on_volume`), only
    after the store install succeeded; a bundle carrying a family not given a folder is
    rejected. ``trust``: the keys it must be signed by (see :func:`verify`). ``limits``:
    fields of :class:`Limits` to change. First, what killed installs left in those
    folders goes (:func:`remove_stale_stages`).
    """
    checked = Limits(**limits)
    _remove_stale(roots or {})
    stages = {name: Stage(root) for name, root in (roots or {}).items()}
    check = None
    if expect is not None and not force:
        check = _fingerprint_check(str(path), expect, policy)
    try:
        info = _merge(path, store, checked, stages, check, trust, allow_downgrade)
    except BaseException:
        _discard(stages, failed=True)
        raise
    _discard(stages, failed=False)
    return info


def _merge(
    path: Path,
    store: Store,
    limits: Limits,
    stages: dict[str, Stage],
    check: Callable[[str, Fingerprint], None] | None,
    trust: Trust | None,
    allow_downgrade: bool,
) -> dict[str, Any]:
    """Read the bundle at ``path`` into ``stages``, then install its entries in ``store``
    as one generation, if its sequence may follow the installed ones; the staged files
    move in after the swap."""
    bundle, reader = read(
        path, limits, parts=bundled_parts(), stages=stages, check=check, trust=trust
    )
    same = _installed_already(store, bundle)
    if same is not None:
        return same
    parts = list(reader.parts.values())

    def admit() -> dict[str, Any]:  # under the store's lock, before anything is written
        return versions.admit(store, bundle, allow_downgrade=allow_downgrade)

    def previous() -> dict[str, Any]:  # under the store's lock, before the seal
        versions.raise_mark(store, bundle, downgrade=allow_downgrade)
        return {key: value for part in parts for key, value in part.before_seal().items()}

    def commit() -> None:  # after the swap: each family's files into its folder
        for part in parts:
            part.commit()

    record = _record(bundle, parts)
    return store.install(
        bundle.entries, record=record, after_swap=commit, before_seal=previous, admit=admit
    )


def _discard(stages: dict[str, Stage], *, failed: bool) -> None:
    """Remove every stage's folder; ``failed``: the folders it made go too."""
    for stage in stages.values():
        stage.discard(failed=failed)


def rollback(store: Store, *, roots: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """Undo the latest bundle install not yet undone (``Store.rollback``), and put back
    what it replaced in each family's folder of ``roots`` (family name -> folder)."""
    chosen = dict(roots or {})

    def undo(record: Record) -> None:
        for name, part in bundled_parts().items():
            if name in chosen:
                part.undo(chosen[name], record)
            elif any(record.extra.get(key) for key in part.record_keys()):
                log.warning(
                    "rollback of %s: %s indexes stay as it left them (no %s folder given)",
                    record.id,
                    name,
                    name,
                )

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


def _record(bundle: Bundle, parts: list[PartReader]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for part in parts:
        counts.update(part.record())
    return {
        "bundle": {
            "name": bundle.name,
            "version": bundle.version,
            "sequence": bundle.sequence,
            "sha256": bundle.sha256,
            "manifest_sha256": bundle.manifest_sha256,
            "signed_by": bundle.signed_by,
            "vouched": bundle.vouched,
            "file": bundle.path.name,
        },
        "entries": len(bundle.entries),
        **counts,
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
