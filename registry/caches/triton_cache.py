"""Restore and save Triton's compile cache (TRITON_CACHE_DIR) from and to the volume.

Triton's group files (``<hash>/__grp__<kernel>.json``) list their members by absolute
path, and a lookup misses when any listed path does not exist. A cache copied to
another folder therefore misses everywhere; ``restore`` rewrites every group file to
the folder it now lives in, so the relocated cache hits.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import shutil
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from registry.core import atomic, triton_internals
from registry.core.explain import Differences
from registry.core.fingerprint import Fingerprint

log = logging.getLogger(__name__)
GROUP_PREFIX = "__grp__"
MAX_GROUP_BYTES = 2**20  # a group file lists a kernel's few files: a few hundred bytes
STALE_TEMP_S = 3600.0
RESTORE_THREADS = 8  # copies at once into a pod's cache (file I/O releases the GIL)
ORIGINS = ".origins"  # beside the kernels' folders: what each was compiled with
MAX_ORIGIN_BYTES = 16 * 2**20
MAX_ORIGIN_FOLDERS = 200_000
MAX_METADATA_BYTES = 2**20
MAX_FILE_BYTES = 256 * 2**20  # one artifact, as a bundle member: a cubin or .so is MiBs


@dataclass
class CacheSync:
    copied: int = 0  # files written
    present: int = 0  # files already there with the same size
    relocated: int = 0  # group files rewritten to the new folder
    skipped: list[str] = field(default_factory=list)  # files not copied, with the reason
    folders: set[str] = field(default_factory=set)  # cache folders a file was written to


@dataclass(frozen=True)
class Origin:
    """What a pod's Triton cache was compiled with: the factors of Triton's cache keys,
    which Triton hashes without listing them (``explain`` names the one that differs)."""

    triton: str
    triton_build: str
    compute_capability: str
    ptxas: str
    env: Mapping[str, str] = field(default_factory=dict)  # knobs that enter the key

    def factors(self) -> dict[str, object]:
        out: dict[str, object] = {
            "Triton version": self.triton,
            "Triton build": self.triton_build,
            "compute capability": self.compute_capability,
            "ptxas": self.ptxas,
        }
        return out

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    @classmethod
    def of(cls, fingerprint: Fingerprint, env: Mapping[str, str] | None = None) -> Origin:
        """The origin of kernels compiled on the host of ``fingerprint``; ``env``: the
        knobs that enter Triton's key (default: this process's)."""
        sw, cc = fingerprint.software, fingerprint.hardware.compute_capability
        knobs = triton_internals.cache_env() if env is None else dict(env)
        return cls(sw.triton, sw.triton_hash, cc, sw.ptxas, knobs)

    @classmethod
    def from_json(cls, data: Any) -> Origin:
        """The origin ``asdict`` wrote; ValueError for anything else."""
        if not isinstance(data, dict):
            raise ValueError("an origin is an object")
        env = data.get("env", {})
        text = [data.get(k) for k in ("triton", "triton_build", "compute_capability", "ptxas")]
        if not all(isinstance(v, str) for v in text):
            raise ValueError("an origin's fields are strings")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError("an origin's env is an object of strings")
        triton, build, capability, ptxas = (str(v) for v in text)
        return cls(triton, build, capability, ptxas, env)


def save(cache_dir: Path, target: Path, origin: Origin | None = None) -> CacheSync:
    """Copy new compile artifacts from ``cache_dir`` into ``target`` (on the volume);
    ``origin``: what this host compiled them with, recorded for the folders written."""
    sync = CacheSync()
    remove_stale_temp_files(target)
    for rel, src in cache_files(cache_dir):
        if _is_new(src, target / rel, sync) and _copied(src, target / rel, sync, durable=True):
            sync.copied += 1
            sync.folders.add(rel.parent.name)
    if origin is not None and sync.folders:
        record_origin(target, origin, sync.folders)
    log.info(
        "saved triton cache %s -> %s: %d new, %d present",
        cache_dir,
        target,
        sync.copied,
        sync.present,
    )
    return sync


def restore(source: Path, cache_dir: Path) -> CacheSync:
    """Copy the artifacts in ``source`` into ``cache_dir`` and point their groups there.

    The pod's own cache is scratch that a restarted pod restores again: its files are
    written whole but not fsynced, several at a time (max-autotune leaves thousands of
    files: 3.2 s one by one with fsyncs on one H200 host)."""
    sync = CacheSync()
    copies = [(src, cache_dir / rel) for rel, src in cache_files(source)]
    copies = [(src, dst) for src, dst in copies if _is_new(src, dst, sync)]
    with ThreadPoolExecutor(RESTORE_THREADS) as pool:
        done = list(pool.map(lambda job: _copied(job[0], job[1], sync, durable=False), copies))
    copied = [dst for (_, dst), ok in zip(copies, done, strict=True) if ok]
    sync.copied += len(copied)
    sync.folders.update(dst.parent.name for dst in copied)
    sync.relocated = relocate(cache_dir)
    # the relocation is news only when it happened: group files named another folder
    moved = (
        f"; {sync.relocated} kernel groups pointed at this folder (they named the one they "
        "were compiled in)"
        if sync.relocated
        else ""
    )
    log.info(
        "restored triton cache %s -> %s: %d new, %d present%s",
        source,
        cache_dir,
        sync.copied,
        sync.present,
        moved,
    )
    return sync


def is_group(name: str) -> bool:
    """Whether a cache file named ``name`` is a group file."""
    return name.startswith(GROUP_PREFIX) and name.endswith(".json")


def relocate(cache_dir: Path, groups: Iterable[Path] | None = None) -> int:
    """Rewrite group files whose member paths are not in their folder; returns how many.

    ``groups``: the group files to look at (default: every one in ``cache_dir``). One
    that is unreadable or over :data:`MAX_GROUP_BYTES` is skipped and logged; a member
    whose path names no file (``/``, ``..``, empty) is dropped, never pointed at a folder.
    """
    count = 0
    found = cache_dir.glob(f"*/{GROUP_PREFIX}*.json") if groups is None else groups
    for group in sorted(found):
        try:
            children = group_children(group)
        except (OSError, ValueError) as e:
            log.warning("skipping triton group file %s: %s", group, e)
            continue
        moved = {
            name: str(group.parent / Path(path).name)
            for name, path in children.items()
            if Path(path).name not in ("", ".", "..")
        }
        if moved != children:
            atomic.write_bytes(group, json.dumps({"child_paths": moved}).encode())
            count += 1
    return count


def group_children(group: Path) -> dict[str, str]:
    """A group file's ``{name: path}`` (Triton's own form: absolute paths); ValueError
    for anything else (too big, corrupt, wrong types), OSError when it cannot be read."""
    return parse_group(atomic.read_bounded(group, MAX_GROUP_BYTES))


def parse_group(raw: bytes) -> dict[str, str]:
    """A group file's bytes as ``{name: path}``; ValueError for anything else."""
    data = atomic.loads(raw)
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in children.items()
    ):
        raise ValueError("not a group file: no 'child_paths' object of strings")
    return children


def remove_stale_temp_files(folder: Path, older_than_s: float = STALE_TEMP_S) -> int:
    """Remove what killed writers left: ``.tmp-*`` files of a copy, once ``older_than_s``
    old (a live copy finishes in seconds). A bundle install's ``.bundle-*`` staging
    folders are not these: each holds a lock while its install lives
    (``registry.families.staging``), which removes them."""
    if not folder.is_dir():
        return 0
    removed = 0
    cutoff = time.time() - older_than_s
    leftovers = list(folder.glob(f"*/{atomic.TEMP_PREFIX}*"))
    for path in leftovers:
        with contextlib.suppress(OSError):
            st = path.lstat()
            if st.st_mtime < cutoff:
                shutil.rmtree(path) if stat.S_ISDIR(st.st_mode) else path.unlink()
                removed += 1
    return removed


def cache_files(cache_dir: Path) -> Iterator[tuple[Path, Path]]:
    """``(relative path, path)`` of every finished artifact: skips Triton's temp folders
    and lock files, which belong to a compile in progress."""
    if not cache_dir.is_dir():
        return
    for folder in sorted(p for p in cache_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.is_symlink() and _is_artifact(path.name):
                yield path.relative_to(cache_dir), path


def _is_artifact(name: str) -> bool:
    return name != "lock" and not name.startswith((".", "tmp.", atomic.TEMP_PREFIX))


def _copied(src: Path, dst: Path, sync: CacheSync, *, durable: bool) -> bool:
    """Copy one artifact, read in pieces and at most :data:`MAX_FILE_BYTES` even while it
    grows; one too big or no longer a plain file is skipped and listed, not the others."""
    try:
        atomic.copy_file(src, dst, limit=MAX_FILE_BYTES, durable=durable)
    except ValueError as e:  # too big, grown past the limit, not a regular file
        sync.skipped.append(f"{src}: {e}")
        log.warning("triton cache file %s not copied: %s", src, e)
        return False
    except FileNotFoundError:  # removed since listed: nothing to copy
        return False
    except OSError as e:
        if e.errno != errno.ELOOP:  # a link put in its place since listed: never followed
            raise
        sync.skipped.append(f"{src}: a link, not followed")
        return False
    return True


def _is_new(src: Path, dst: Path, sync: CacheSync) -> bool:
    """Whether ``dst`` lacks ``src`` (counted in ``sync.present`` when it has it)."""
    # A group file differs only in the folder it names, so any copy of it is current.
    is_group = src.name.startswith(GROUP_PREFIX)
    if dst.exists() and (is_group or dst.stat().st_size == src.stat().st_size):
        sync.present += 1
        return False
    return True


# ---- origins and predictions ---------------------------------------------------------


def record_origin(
    target: Path, origin: Origin, folders: Iterable[str], *, writer: str = ""
) -> None:
    """Add ``folders`` to ``origin``'s record in ``target`` (merged with what is there;
    two writers racing lose a folder's record at worst, never a kernel: ``writer`` names
    a record of one writer's own, a harvesting sidecar's). Never raises: a record that
    cannot be read is replaced, one that cannot be written is logged; a folder past
    :data:`MAX_ORIGIN_FOLDERS` is left out (``explain`` reads its metadata instead)."""
    name = origin.digest()[:32] + (f"-{writer}" if writer else "")
    path = target / ORIGINS / f"{name}.json"
    try:
        held = set(_origin_record(path)[1]) if path.exists() else set()
    except (OSError, ValueError) as e:
        log.warning("triton cache: replacing the unreadable origin record %s: %s", path, e)
        held = set()
    new = sorted(set(folders) - held)
    if not new:
        return
    room = MAX_ORIGIN_FOLDERS - len(held)
    if len(new) > room:
        log.warning(
            "triton cache: origin record %s is full; %d folders left out",
            path,
            len(new) - max(room, 0),
        )
        new = new[: max(room, 0)]
    try:
        atomic.write_json(path, {"origin": asdict(origin), "folders": sorted(held | set(new))})
    except OSError as e:
        log.warning("triton cache: origin not recorded in %s: %s", target, e)


def origins(target: Path) -> dict[str, Origin]:
    """Each recorded cache folder's origin; unreadable records are skipped, logged."""
    found: dict[str, Origin] = {}
    for path in sorted((target / ORIGINS).glob("*.json")):
        try:
            origin, folders = _origin_record(path)
        except (OSError, ValueError) as e:
            log.warning("skipping triton cache origin %s: %s", path, e)
            continue
        found.update(dict.fromkeys(folders, origin))
    return found


def _origin_record(path: Path) -> tuple[Origin, list[str]]:
    data = atomic.loads(atomic.read_bounded(path, MAX_ORIGIN_BYTES))
    folders = data.get("folders") if isinstance(data, dict) else None
    if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
        raise ValueError("no list of folders")
    return Origin.from_json(data.get("origin")), folders


Kind = Literal["kernels", "autotune"]


def held_differences(
    target: Path,
    host: Origin,
    kind: Kind,
    *,
    restored: bool = True,
    known: Mapping[str, Origin] | None = None,
) -> tuple[dict[str, Differences], set[str]]:
    """For each compiled kernel (``kernels``) or autotune result (``autotune``) in
    ``target``, by cache folder: how its origin differs from ``host`` (empty: a hit
    here); and the folders with no known origin (no record, no readable metadata),
    which are not predicted. ``restored``: ``target`` is copied by :func:`restore`,
    which points groups at their new folder; otherwise (a live TRITON_CACHE_DIR) a
    group naming another folder is a miss, as Triton finds none of its files.
    ``known``: the kernels' origins, read already (the volume's, for a cache restored
    from it); default: those recorded in ``target``."""
    recorded = origins(target) if known is None else known
    held: dict[str, Differences] = {}
    unknown: set[str] = set()
    for folder in _cache_folders(target):
        names = [p.name for p in folder.iterdir()]
        if not _holds(kind, names):
            continue
        found = _held_origin(folder, names, recorded.get(folder.name), kind, restored=restored)
        if found is None:
            unknown.add(folder.name)
        else:
            held[folder.name] = _differences(host, *found)
    return held, unknown


def _cache_folders(target: Path) -> list[Path]:
    """The cache folders in ``target``, sorted; none where it is not a folder. A hidden
    folder (a restore's staging) or a symlink is not one."""
    if not target.is_dir():
        return []
    folders = sorted(p for p in target.iterdir() if p.is_dir())
    return [p for p in folders if not p.name.startswith(".") and not p.is_symlink()]


def _holds(kind: Kind, names: list[str]) -> bool:
    """Whether a cache folder of these file ``names`` holds a ``kind``: a compiled
    kernel's group file, or an autotune result."""
    if kind == "kernels":
        return any(is_group(n) for n in names)
    return any(n.endswith(".autotune.json") for n in names)


def _held_origin(
    folder: Path, names: list[str], origin: Origin | None, kind: Kind, *, restored: bool
) -> tuple[dict[str, object], Mapping[str, str] | None] | None:
    """What ``folder``'s kernel or autotune result was made under: its recorded
    ``origin``, else a kernel's own metadata; None when neither is known."""
    if kind != "kernels":
        return _stored(origin) if origin else None
    group = min(n for n in names if is_group(n))
    found = _stored(origin) if origin else _from_metadata(folder, group)
    if found is not None and not restored:
        found[0].update(_group_folder(folder, group))
    return found


def _stored(origin: Origin) -> tuple[dict[str, object], Mapping[str, str] | None]:
    return origin.factors(), origin.env


def _from_metadata(
    folder: Path, group: str
) -> tuple[dict[str, object], Mapping[str, str] | None] | None:
    """What a kernel's own metadata says of its origin; None when it cannot be read."""
    name = group.removeprefix(GROUP_PREFIX)
    try:
        factors = metadata_factors(atomic.read_bounded(folder / name, MAX_METADATA_BYTES))
    except (OSError, ValueError):
        return None
    return factors, None


def metadata_factors(data: bytes) -> dict[str, object]:
    """The factors a kernel's metadata file states (its target, its Triton version; not
    every env knob, which Triton does not keep); ValueError for anything else."""
    try:
        meta = atomic.loads(data)
        factors: dict[str, object] = {"compute capability": _capability(meta["target"]["arch"])}
    except (KeyError, TypeError) as e:
        raise ValueError(f"no kernel metadata: {e}") from None
    if isinstance(meta.get("triton_version"), str):
        factors["Triton version"] = meta["triton_version"]
    return factors


def compare(host: Origin, factors: Mapping[str, object]) -> Differences:
    """How stated ``factors`` (a kernel's metadata) differ from ``host``."""
    return _differences(host, factors, None)


def _group_folder(folder: Path, group: str) -> dict[str, object]:
    """``{"path group": <the folder its members are in>}`` when a group names another
    folder than its own (a cache copied without :func:`restore`)."""
    try:
        children = group_children(folder / group)
    except (OSError, ValueError):
        return {}
    elsewhere = sorted({str(Path(p).parent) for p in children.values()} - {str(folder)})
    return {"path group": elsewhere[0]} if elsewhere else {}


def _capability(arch: object) -> str:
    """Triton's ``target.arch`` (90, "gfx942") as a compute capability ("9.0")."""
    return f"{int(arch) // 10}.{int(arch) % 10}" if isinstance(arch, int) else str(arch)


def _differences(
    host: Origin, stored: Mapping[str, object], env: Mapping[str, str] | None
) -> dict[str, tuple[object, object]]:
    mine: dict[str, object] = {**host.factors(), "path group": "its own folder"}
    out = {k: (mine[k], v) for k, v in stored.items() if k in mine and mine[k] != v}
    if env is not None:
        for knob in sorted(set(env) | set(host.env)):
            if env.get(knob) != host.env.get(knob):
                out[f"env {knob}"] = (host.env.get(knob), env.get(knob))
    return out
