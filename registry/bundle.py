"""Bundles: one archive of registry entries and, optionally, Triton compile artifacts.

Archive (tar, gzip) members::

    MANIFEST.json                     format, schema, name, version, created,
                                      fingerprints covered, sha256 and size of every member
    entries/<kernel>/<gpu>/<software>/<shape>.json
    triton-cache/<hash>/<artifact>

``verify`` reads the whole archive and checks it before ``install`` writes anything;
``install`` swaps in a new store generation in one rename, so a bundle is installed
whole or not at all, and ``Store.rollback`` undoes it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from registry import atomic
from registry.entry import Entry, now_iso
from registry.errors import BundleRejected, RegistryError
from registry.fingerprint import Fingerprint, MatchPolicy
from registry.store import Store
from registry.triton_cache import cache_files, relocate

FORMAT = "triton-warmup-bundle"
SCHEMA = 1
MANIFEST = "MANIFEST.json"
ENTRIES = "entries"
TRITON_CACHE = "triton-cache"
MAX_MEMBER_BYTES = 256 * 2**20
MAX_TOTAL_BYTES = 2 * 2**30


@dataclass
class Bundle:
    """A verified bundle: its manifest, its entries and its compile artifacts."""

    path: Path
    manifest: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)  # "<hash>/<file>" -> bytes
    sha256: str = ""

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])


def create(
    out: Path,
    *,
    name: str,
    version: str,
    entries: Iterable[Entry],
    triton_cache: Path | None = None,
) -> dict[str, Any]:
    """Write a bundle of ``entries`` (and the artifacts in ``triton_cache``) to ``out``."""
    if not name or not version:
        raise RegistryError(f"Bundle needs a name and a version; got {name!r} and {version!r}.")
    members: dict[str, bytes] = {}
    fingerprints: dict[str, dict[str, Any]] = {}
    for entry in entries:
        members[f"{ENTRIES}/{entry.relpath().as_posix()}"] = atomic.dumps(entry.to_json()).encode()
        fingerprints[entry.fingerprint.digest()] = _describe(entry.fingerprint)
    if triton_cache is not None:
        for rel, path in cache_files(triton_cache):
            members[f"{TRITON_CACHE}/{rel.as_posix()}"] = path.read_bytes()
    if not members:
        raise RegistryError(f"Bundle '{name}' would be empty: no entries and no artifacts.")
    manifest = {
        "format": FORMAT,
        "schema": SCHEMA,
        "name": name,
        "version": version,
        "created": now_iso(),
        "fingerprints": [fingerprints[k] for k in sorted(fingerprints)],
        "members": {p: {"sha256": _sha(b), "size": len(b)} for p, b in sorted(members.items())},
    }
    _write_archive(
        out, {MANIFEST: atomic.dumps(manifest).encode(), **dict(sorted(members.items()))}
    )
    return manifest


def _describe(fp: Fingerprint) -> dict[str, Any]:
    return {"digest": fp.digest(), "gpu": fp.gpu_slug(), "software": fp.software_slug()}


def _write_archive(out: Path, members: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    atomic.write_bytes(out, buffer.getvalue())


def verify(
    path: Path, *, max_member_bytes: int = MAX_MEMBER_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES
) -> Bundle:
    """Read and check the whole bundle; raise :class:`BundleRejected` naming the first fault."""
    label = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BundleRejected(label, f"cannot read: {e}") from None
    members = _read_members(label, raw, max_member_bytes, max_total_bytes)
    manifest = _check_manifest(label, members)
    bundle = Bundle(path=path, manifest=manifest, sha256=_sha(raw))
    for name, data in members.items():
        if name.startswith(f"{ENTRIES}/"):
            bundle.entries.append(_parse_entry(label, name, data))
        elif name.startswith(f"{TRITON_CACHE}/"):
            bundle.artifacts[_artifact_path(label, name)] = data
    return bundle


def _read_members(label: str, raw: bytes, max_member: int, max_total: int) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            for info in tar:
                _check_member(label, info, max_member)
                if info.isdir():
                    continue
                if info.name in members:
                    raise BundleRejected(label, f"member '{info.name}' appears twice")
                total += info.size
                if total > max_total:
                    raise BundleRejected(label, f"members exceed the total limit {max_total} bytes")
                handle = tar.extractfile(info)
                assert handle is not None  # a regular file always has a handle
                members[info.name] = handle.read(max_member + 1)
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise BundleRejected(label, f"not a readable tar archive ({e})") from None
    return members


def _check_member(label: str, info: tarfile.TarInfo, max_member: int) -> None:
    name = info.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or (parts and parts[0].endswith(":")) or "\\" in name:
        raise BundleRejected(label, f"member '{name}' has an absolute path")
    if ".." in parts:
        raise BundleRejected(label, f"member '{name}' has a '..' component")
    if info.issym() or info.islnk():
        raise BundleRejected(label, f"member '{name}' is a link to '{info.linkname}'")
    if not (info.isreg() or info.isdir()):
        raise BundleRejected(label, f"member '{name}' is a device, fifo or other special file")
    if info.size > max_member:
        raise BundleRejected(label, f"member '{name}' is {info.size} bytes; limit {max_member}")


def _check_manifest(label: str, members: dict[str, bytes]) -> dict[str, Any]:
    if MANIFEST not in members:
        raise BundleRejected(label, f"no {MANIFEST}")
    try:
        manifest = json.loads(members.pop(MANIFEST))
    except ValueError as e:
        raise BundleRejected(label, f"{MANIFEST} is not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleRejected(label, f"{MANIFEST} 'format' is not '{FORMAT}'")
    if manifest.get("schema") != SCHEMA:
        raise BundleRejected(
            label, f"unknown schema version {manifest.get('schema')!r}; this version reads {SCHEMA}"
        )
    for key in ("name", "version", "created", "members"):
        if key not in manifest:
            raise BundleRejected(label, f"{MANIFEST} has no '{key}'")
    listed = manifest["members"]
    if not isinstance(listed, dict):
        raise BundleRejected(label, f"{MANIFEST} 'members' is not an object")
    for name in sorted(set(listed) | set(members)):
        if name not in members:
            raise BundleRejected(label, f"member '{name}' is listed but missing")
        if name not in listed:
            raise BundleRejected(label, f"member '{name}' is not listed in {MANIFEST}")
        expected = listed[name].get("sha256") if isinstance(listed[name], dict) else None
        if _sha(members[name]) != expected:
            raise BundleRejected(label, f"checksum mismatch for '{name}'")
    return manifest


def _parse_entry(label: str, name: str, data: bytes) -> Entry:
    try:
        return Entry.from_json(json.loads(data))
    except (ValueError, RegistryError) as e:
        raise BundleRejected(label, f"entry '{name}': {e}") from None


def _artifact_path(label: str, name: str) -> str:
    parts = PurePosixPath(name).parts[1:]
    if len(parts) != 2:
        raise BundleRejected(label, f"artifact '{name}' is not triton-cache/<hash>/<file>")
    return "/".join(parts)


def install(
    path: Path,
    store: Store,
    *,
    expect: Fingerprint | None,
    policy: MatchPolicy = MatchPolicy.EXACT,
    force: bool = False,
    triton_cache: Path | None = None,
    **limits: int,
) -> dict[str, Any]:
    """Verify ``path``, then merge it into ``store`` as one new generation.

    ``expect``: the fingerprint of the machines this store serves; entries that do not
    match it under ``policy`` reject the bundle unless ``force``. ``None`` skips the check.
    Artifacts go to ``triton_cache`` (the volume's copy of TRITON_CACHE_DIR).
    """
    bundle = verify(path, **limits)
    if expect is not None and not force:
        _check_fingerprints(bundle, expect, policy)
    if bundle.artifacts and triton_cache is None:
        raise BundleRejected(str(path), "it carries Triton artifacts but no cache folder was given")
    if triton_cache is not None and bundle.artifacts:
        _install_artifacts(bundle, triton_cache)
    record = {
        "bundle": {
            "name": bundle.name,
            "version": bundle.version,
            "sha256": bundle.sha256,
            "file": path.name,
        },
        "entries": len(bundle.entries),
        "artifacts": len(bundle.artifacts),
    }
    return store.install(bundle.entries, record=record)


def _check_fingerprints(bundle: Bundle, expect: Fingerprint, policy: MatchPolicy) -> None:
    for entry in bundle.entries:
        mismatch = expect.with_kernel(entry.fingerprint.kernel_hash).mismatches(
            entry.fingerprint, policy
        )
        if mismatch:
            fields = ", ".join(f"{k} ({b!r}, here {a!r})" for k, (a, b) in sorted(mismatch.items()))
            raise BundleRejected(
                str(bundle.path),
                f"entry {entry.relpath()} was tuned for another "
                f"platform under policy '{policy.value}': "
                f"{fields}; pass --force (force=True) to install anyway",
            )


def _install_artifacts(bundle: Bundle, triton_cache: Path) -> None:
    """Stage every artifact, then move each into place; then point groups at the new folder."""
    triton_cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=triton_cache, prefix=".bundle-") as tmp:
        staged = []
        for rel, data in sorted(bundle.artifacts.items()):
            target = Path(tmp) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            staged.append((target, triton_cache / rel))
        for src, dst in staged:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    relocate(triton_cache)


def installed(store: Store) -> list[dict[str, Any]]:
    """The store's kept generations that installed or rolled back a bundle, oldest first."""
    return [g for g in store.generations() if g.get("kind") in ("install", "rollback")]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
