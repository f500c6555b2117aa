"""Inductor's artifacts as a cache family of the registry: what ``torch.compile`` wrote
while a declared model warmed, kept on the volume and restored for the next pod.

Stored as Inductor's own cache files (FX graph, AOTAutograd and autotune entries, the
generated code, compiled kernels), not as a Mega-Cache blob: restoring files is a copy,
and Inductor then hits at its own lookup cost, where ``load_cache_artifacts`` rewrites
every artifact first (4.1 to 5.1 s on one H100 for the 4-block model of [3.1]). The
files carry no path that a hit needs: a cache restored under another folder or home
directory hits (``tests/registry/caches/test_inductor_cache.py``).

Layout under the family's root (``<volume>/inductor``)::

    blobs/<sha[:2]>/<sha256>                       each file once, by content
    models/<model>/<gpu>/<software>/<key>.json     an index: relative path -> sha, size
    quarantine/<sha256>.<time>                     a blob that failed its hash

An index is keyed by the model's key (its code, its shapes: ``warmup.compiled.key``)
and by the fingerprint (torch, Triton, GPU, CUDA, driver); one is restored only for
the same key and an equal fingerprint. Blobs are written before the index that names
them, each atomically; N pods saving the same kernel store it once. A blob whose bytes
no longer hash to its name is quarantined and its file not restored: that model
recompiles it, nothing else is lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from registry.caches.triton_cache import relocate, remove_stale_temp_files
from registry.core import atomic
from registry.core.entry import now_iso
from registry.core.errors import RegistryError
from registry.core.explain import Differences, fingerprint_differences
from registry.core.fingerprint import Fingerprint, machine_name
from registry.core.patterns import MODEL_NAME, SHA256

log = logging.getLogger(__name__)
FORMAT = 1
MAX_FILE_BYTES = 256 * 2**20  # one cache file; Inductor's largest are kernels' .so/.cubin
MAX_MODEL_BYTES = 2 * 2**30  # one model's files together
MAX_FILES = 80_000  # files of one index (its bytes stay under MAX_INDEX_BYTES)
MAX_INDEX_BYTES = 16 * 2**20  # ~180 bytes a file: 90,000 files
MAX_INDEX_VALUES = 2**19  # JSON values of an index, counted before parsing: ~4 a file
_SKIPPED_DIRS = {"locks"}  # Inductor's file locks: a compile in progress, not an artifact
_KEY_DIGEST = re.compile(r"[0-9a-f]{8,64}")


@dataclass
class Saved:
    files: int = 0  # files the index lists
    new_blobs: int = 0  # of them, stored now (the others were there already)
    bytes: int = 0  # of the new blobs
    skipped: list[str] = field(default_factory=list)  # files not stored, with the reason


@dataclass
class Restored:
    index: Path | None = None  # the index restored from; None: none for this key
    copied: int = 0
    present: int = 0  # already in the cache folder with the same content
    quarantined: int = 0  # blobs that failed their hash: their files recompile
    missing: int = 0  # blobs the index names that are not there
    relocated: int = 0  # Triton group files pointed at the new folder
    why_not: str = ""  # no index: the nearest one's differing factor


def index_path(root: Path, model: str, key_digest: str, fingerprint: Fingerprint) -> Path:
    """Where the index of ``model`` at ``key_digest`` for ``fingerprint`` lives."""
    return root / index_relpath(model, key_digest, fingerprint)


def index_relpath(model: str, key_digest: str, fingerprint: Fingerprint) -> str:
    """:func:`index_path` under the family's root (``models/...``)."""
    _check_name(model, key_digest)
    gpu, software = fingerprint.gpu_slug(), fingerprint.software_slug()
    return f"models/{model}/{gpu}/{software}/{key_digest}.json"


def save(
    cache_dir: Path,
    root: Path,
    *,
    model: str,
    key_digest: str,
    key: Mapping[str, Any],
    fingerprint: Fingerprint,
) -> Saved:
    """Store every finished file of ``cache_dir`` as the artifacts of ``model`` at
    ``key_digest``: new blobs first, then the index, each atomically. A file over
    :data:`MAX_FILE_BYTES`, or files past :data:`MAX_MODEL_BYTES` together, are skipped
    and listed (they recompile on the next pod)."""
    target = index_path(root, model, key_digest, fingerprint)
    remove_stale_temp_files(root / "blobs")  # what a writer killed mid-copy left (an hour old)
    saved = Saved()
    files = _store_blobs(cache_dir, root, saved)
    atomic.write_bytes(target, _index_bytes(model, key_digest, key, fingerprint, files))
    saved.files = len(files)
    for line in saved.skipped:
        log.warning("inductor artifact of %s not stored: %s", model, line)
    return saved


def _store_blobs(cache_dir: Path, root: Path, saved: Saved) -> dict[str, list[Any]]:
    """Store each finished file of ``cache_dir`` that fits the family's limits as a blob
    under ``root``; the index's files (relative path -> [sha, size]). ``saved`` counts
    the new blobs and lists the files skipped, with the reason."""
    files: dict[str, list[Any]] = {}
    total = 0
    for rel, path in cache_files(cache_dir):
        try:
            check_relative(rel)  # what a restore would refuse is not stored
        except RegistryError as e:
            saved.skipped.append(str(e))
            continue
        limit = min(MAX_FILE_BYTES, MAX_MODEL_BYTES - total)
        size = path.lstat().st_size
        if size > limit or len(files) >= MAX_FILES:
            saved.skipped.append(f"{rel}: {size} bytes, past the family's limits")
            continue
        try:
            sha, size, new = _store_blob(root, path, limit)  # the size is what was stored
        except FileNotFoundError:  # removed since listed: nothing to keep
            continue
        except (ValueError, OSError) as e:  # grown past the limit, changed, now a link
            saved.skipped.append(f"{rel}: {e}")
            continue
        files[rel] = [sha, size]
        total += size
        saved.new_blobs += new
        saved.bytes += size if new else 0
    return files


def _index_bytes(
    model: str,
    key_digest: str,
    key: Mapping[str, Any],
    fingerprint: Fingerprint,
    files: dict[str, list[Any]],
) -> bytes:
    """The index of ``model`` at ``key_digest`` that lists ``files``, as written; one
    over :data:`MAX_INDEX_BYTES` raises :class:`RegistryError`."""
    index = {
        "format": FORMAT,
        "model": model,
        "key_digest": key_digest,
        "key": dict(key),
        "fingerprint": fingerprint.to_json(),
        "files": files,
        "created": now_iso(),
        "host": machine_name(),
    }
    data = json.dumps(index, sort_keys=True).encode()
    if len(data) > MAX_INDEX_BYTES:  # ~180 bytes a file: over 90,000 files
        raise RegistryError(
            f"the index of {model} would be {len(data)} bytes; limit {MAX_INDEX_BYTES}"
        )
    return data


def restore(
    root: Path,
    cache_dir: Path,
    *,
    model: str,
    key_digest: str,
    fingerprint: Fingerprint,
    thing: str = "model",
) -> Restored:
    """Copy the files of ``model``'s index for this key and fingerprint into
    ``cache_dir``, each blob checked against its hash on the way; ``why_not`` says why
    there is nothing to restore (no index at all, or the nearest one's differing factor)."""
    done = Restored()
    path = index_path(root, model, key_digest, fingerprint)
    try:
        index = read_index(path)
    except FileNotFoundError:
        done.why_not = explain_miss(root, model, key_digest, fingerprint, thing)
        return done
    except (OSError, RegistryError) as e:
        _quarantine_index(root, path, str(e))
        done.why_not = f"its index was unreadable and is quarantined ({e})"
        return done
    if Fingerprint.from_json(index["fingerprint"]).digest() != fingerprint.digest():
        done.why_not = "its index was written for another fingerprint"  # a hash collision
        return done
    done.index = path
    for rel, (sha, size) in index["files"].items():
        _restore_file(root, cache_dir / rel, sha, size, done)
    done.relocated = _relocate_triton_groups(cache_dir)
    return done


def _restore_file(root: Path, dst: Path, sha: str, size: int, done: Restored) -> None:
    """Copy the blob ``sha`` onto ``dst``, in pieces, hashed on the way and never past the
    ``size`` the index gives it (what a restore writes is what its index declares)."""
    if _holds(dst, sha, size):
        done.present += 1
        return
    blob = blob_path(root, sha)
    try:
        with atomic.open_bounded(blob, size) as src:
            try:
                copied = _copy_blob(src, dst, sha, size)
            except OSError as e:  # something in the way in the cache folder: it recompiles
                log.warning("inductor artifact %s not restored: %s", dst, e)
                done.missing += 1
                return
    except FileNotFoundError:
        done.missing += 1
        return
    except atomic.TooBig as e:  # over what the index gives it: which of the two is wrong?
        if not _is_named_by_its_bytes(blob, sha):
            _quarantine_blob(root, blob, "its bytes no longer hash to its name")
            done.quarantined += 1
            return
        log.warning(
            "inductor artifact %s not restored: blob %s holds more than its index gives (%s)",
            dst,
            sha[:16],
            e,
        )
        done.missing += 1
        return
    except (OSError, ValueError) as e:  # a folder or a link in its place, unreadable
        _quarantine_blob(root, blob, f"unreadable: {e}")
        done.quarantined += 1
        return
    if copied:
        done.copied += 1
    else:
        _quarantine_blob(root, blob, "its bytes no longer hash to its name")
        done.quarantined += 1


def _holds(dst: Path, sha: str, size: int) -> bool:
    """Whether ``dst`` is a file of ``size`` bytes that hash to ``sha`` (a link, or one
    that changes while it is read, is not: it is replaced)."""
    try:
        return dst.is_file() and dst.stat().st_size == size and file_sha(dst, size) == sha
    except (OSError, ValueError):
        return False


def _is_named_by_its_bytes(blob: Path, sha: str) -> bool:
    """Whether ``blob`` hashes to its name (read in pieces, never past the family's limit)."""
    try:
        return file_sha(blob) == sha
    except (OSError, ValueError):
        return False


def _copy_blob(src: BinaryIO, dst: Path, sha: str, size: int) -> bool:
    """Copy what is left of the open blob ``src`` onto ``dst`` in pieces, keeping its
    permission bits (a ``.so`` stays executable): at most ``size`` bytes
    (:class:`atomic.TooBig` past it), and ``dst`` is replaced only when they hash to
    ``sha`` (False, ``dst`` as it was, when they do not)."""
    digest = hashlib.sha256()
    try:
        with atomic.replacing(dst, mode=os.fstat(src.fileno()).st_mode & 0o777) as out:
            for piece in atomic.chunks(src, size, dst.name):
                digest.update(piece)
                out.write(piece)
            if digest.hexdigest() != sha:
                raise _NotItsHash
    except _NotItsHash:
        return False
    return True


class _NotItsHash(Exception):
    """A copy whose bytes do not hash to the name it was made under: the copy is dropped."""


def _relocate_triton_groups(cache_dir: Path) -> int:
    """Triton group files list their members by absolute path (``registry.caches.triton_cache``):
    those under Inductor's own Triton folder are pointed at where they now are."""
    count = 0
    for folder in sorted(cache_dir.glob("triton/*")):
        if folder.is_dir() and not folder.is_symlink():
            count += relocate(folder)
    return count


def explain_miss(
    root: Path, model: str, key_digest: str, fingerprint: Fingerprint, thing: str = "model"
) -> str:
    """Why no index of ``model`` (a ``thing``: a model, a declared folder) serves this key
    and fingerprint, in one line: none stored, its key changed (a model's code or shapes,
    a folder's declared key), or the factor that differs."""
    others = list(index_files(root / "models" / model, depth=3))
    if not others:
        return f"no artifacts of {thing} {model} are stored"
    same_key = [p for p in others if p.stem == key_digest]
    if not same_key:
        changed = "other code or shapes" if thing == "model" else "another key"
        return f"the stored artifacts of {thing} {model} are for {changed}"
    for path in same_key:
        with contextlib.suppress(OSError, RegistryError, KeyError):
            theirs = Fingerprint.from_json(read_index(path)["fingerprint"])
            differences = fingerprint.diff(theirs)
            if differences:
                name, (mine, stored) = next(iter(sorted(differences.items())))
                return f"stored for {name}={stored}, this host has {mine}"
    return f"the stored artifacts of {thing} {model} are unreadable"


def model_differences(
    root: Path, model: str, key_digest: str, fingerprint: Fingerprint
) -> Differences | None:
    """For ``explain``: how the closest stored index of ``model`` differs from this key
    and fingerprint. {} for a hit; the fingerprint's factors for an index of the same
    key; "model code or shapes" when only other keys are stored; None for none at all."""
    if index_path(root, model, key_digest, fingerprint).is_file():
        return {}
    others = list(index_files(root / "models" / model, depth=3))
    if not others:
        return None
    found = []
    for path in (p for p in others if p.stem == key_digest):
        with contextlib.suppress(OSError, RegistryError, KeyError):
            theirs = Fingerprint.from_json(read_index(path)["fingerprint"])
            found.append(fingerprint_differences(fingerprint.diff(theirs)))
    if found:
        return min(found, key=len)
    return {"model code or shapes": (key_digest[:12], others[0].stem[:12])}


def index_files(folder: Path, depth: int = 4) -> Iterator[Path]:
    """The index files ``depth`` folders down (``models/<model>/<gpu>/<software>/``), in
    order; an interrupted writer's temporary file (``.tmp-*``) is none."""
    pattern = "/".join(["*"] * (depth - 1) + ["*.json"])
    if folder.is_dir():
        yield from sorted(p for p in folder.glob(pattern) if not p.name.startswith("."))


def read_index(path: Path) -> dict[str, Any]:
    """An index, checked (:func:`parse_index`); FileNotFoundError when there is none."""
    try:
        data = atomic.read_bounded(path, MAX_INDEX_BYTES)
    except ValueError as e:  # too big, not a regular file
        raise RegistryError(f"{path}: {e}") from None
    return parse_index(data, str(path))


def parse_index(data: bytes, label: str) -> dict[str, Any]:
    """An index's bytes, checked: every path relative and inside the cache, every blob a
    sha256, the fingerprint whole; :class:`RegistryError` naming ``label`` otherwise."""
    try:
        index = atomic.loads(data)
    except ValueError as e:
        raise RegistryError(f"{label}: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise RegistryError(f"{label}: not an inductor artifact index of format {FORMAT}")
    files = index.get("files")
    if not isinstance(files, dict):
        raise RegistryError(f"{label}: 'files' is not an object")
    if len(files) > MAX_FILES:
        raise RegistryError(f"{label}: lists {len(files)} files; limit {MAX_FILES}")
    total = 0  # each path is a file a restore writes, however many paths share a blob
    for rel, value in files.items():
        check_relative(rel)
        ok = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
        if not ok or not SHA256.fullmatch(value[0]) or not isinstance(value[1], int):
            raise RegistryError(f"{label}: file {rel!r} is not [sha256, size]")
        if isinstance(value[1], bool) or not 0 <= value[1] <= MAX_FILE_BYTES:
            raise RegistryError(f"{label}: file {rel!r} has size {value[1]!r}")
        total += value[1]
    if total > MAX_MODEL_BYTES:
        raise RegistryError(f"{label}: its files restore {total} bytes; limit {MAX_MODEL_BYTES}")
    model, key_digest = index.get("model"), index.get("key_digest")
    if not isinstance(model, str) or not isinstance(key_digest, str):
        raise RegistryError(f"{label}: 'model' and 'key_digest' are not strings")
    _check_name(model, key_digest)
    Fingerprint.from_json(index.get("fingerprint"))
    return index


def placed(index: Mapping[str, Any]) -> str:
    """Where a parsed index belongs under the family's root (``models/...``)."""
    fingerprint = Fingerprint.from_json(index["fingerprint"])
    return index_relpath(index["model"], index["key_digest"], fingerprint)


def blob_relpath(sha: str) -> str:
    return f"blobs/{sha[:2]}/{sha}"


def check_relative(rel: str) -> str:
    """A cache file's relative path, refused when it could leave the cache folder."""
    parts = PurePosixPath(rel).parts
    odd = "\\" in rel or any(ord(c) < 32 or c == "\x7f" for c in rel)  # NUL, line breaks
    if not rel or rel.startswith("/") or odd or any(p in ("", ".", "..") for p in parts):
        raise RegistryError(f"inductor artifact path {rel!r} is not a plain relative path")
    if parts[0] in _SKIPPED_DIRS or any(_is_temp(p) for p in parts):
        raise RegistryError(f"inductor artifact path {rel!r} names a lock or a temporary file")
    return rel


def cache_files(cache_dir: Path) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of every finished regular file of an Inductor cache
    folder: no symlink is followed, no lock or temporary file is taken."""
    if not cache_dir.is_dir():
        return
    for folder, dirs, names in os.walk(cache_dir):
        here = Path(folder)
        dirs[:] = sorted(
            d for d in dirs if not _is_temp(d) and not (here == cache_dir and d in _SKIPPED_DIRS)
        )
        for name in sorted(names):
            path = here / name
            if _is_temp(name) or not stat.S_ISREG(path.lstat().st_mode):
                continue
            yield path.relative_to(cache_dir).as_posix(), path


def _is_temp(name: str) -> bool:
    # atomic writers' temps (ours, Inductor's ``tmp*``/``.tmp``), Triton's ``tmp.`` folders
    return name.startswith((".", "tmp")) or name.endswith((".tmp", ".lock"))


def blob_path(root: Path, sha: str) -> Path:
    return root / blob_relpath(sha)


def file_sha(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The sha256 of a regular file of at most ``limit`` bytes, read in pieces
    (:class:`atomic.TooBig` past it, even while it grows; ValueError for no regular file)."""
    with atomic.open_bounded(path, limit) as file:
        return _sha_and_size(file, limit, path.name)[0]


def _sha_and_size(file: BinaryIO, limit: int, name: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for piece in atomic.chunks(file, limit, name):
        digest.update(piece)
        size += len(piece)
    return digest.hexdigest(), size


def _store_blob(root: Path, path: Path, limit: int) -> tuple[str, int, bool]:
    """The file's sha256, its size and whether it was stored now: hashed in pieces, then
    (when new) copied in pieces and hashed again; :class:`atomic.TooBig` past ``limit``
    bytes (even while it grows), ValueError when it changed between the two reads."""
    with atomic.open_bounded(path, limit) as src:
        sha, size = _sha_and_size(src, limit, path.name)
        blob = blob_path(root, sha)
        if blob.is_file() and blob.stat().st_size == size:
            return sha, size, False
        src.seek(0)
        if not _copy_blob(src, blob, sha, size):
            raise ValueError("it changed while it was stored")
    return sha, size, True


def put_blob(root: Path, data: bytes, *, mode: int = 0o644) -> tuple[str, bool]:
    """``data``'s sha256 and whether it was stored now (content-addressed: a blob that
    is there with the right size is the same bytes, up to a hash collision)."""
    sha = hashlib.sha256(data).hexdigest()
    blob = blob_path(root, sha)
    if blob.is_file() and blob.stat().st_size == len(data):
        return sha, False
    atomic.write_bytes(blob, data, mode=mode)
    return sha, True


def _quarantine_blob(root: Path, blob: Path, reason: str) -> None:
    _quarantine(root, blob, f"{blob.name}.{time.time_ns()}", reason)


def _quarantine_index(root: Path, path: Path, reason: str) -> None:
    _quarantine(root, path, f"index-{path.parent.name}-{path.name}.{time.time_ns()}", reason)


def _quarantine(root: Path, path: Path, name: str, reason: str) -> None:
    """Move ``path`` (a blob, an index; a folder in its place too) out of the way."""
    target = root / "quarantine" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, target)
        log.warning("inductor artifact %s quarantined to %s: %s", path, target, reason)


def _check_name(model: str, key_digest: str) -> None:
    if not MODEL_NAME.fullmatch(model):
        raise RegistryError(f"model name {model!r} is not 1-63 of a-z 0-9 _ . -")
    if not _KEY_DIGEST.fullmatch(key_digest):
        raise RegistryError(f"model key digest {key_digest!r} is not 8-64 hex digits")
