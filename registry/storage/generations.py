"""A store's generations on disk: their records, their entry files, and how a broken
``current`` link or record is told apart from a healthy one.

A generation is *sealed* when its ``GENERATION.json`` parses as a :class:`Record`. Only
:class:`registry.storage.store.Store` writes here (under its lock, through
:class:`registry.storage.generation_writer.GenerationWriter`); this module only reads.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from registry.core import atomic

CURRENT = "current"
GENERATION_FILE = "GENERATION.json"
STAMP_FILE = ".stamp"
MAX_RECORD_BYTES = 4 * 2**20  # a record lists the paths a bundle changed: thousands at most
_GEN = re.compile(r"gen-([0-9]{6,})")  # fullmatch: no trailing newline, ASCII digits
_TEXT = ("id", "created", "kind")


@dataclass(frozen=True)
class Record:
    """What a ``GENERATION.json`` holds: which change made the generation, on which parent.

    ``changed``: the entry paths an install wrote (a rollback restores them);
    ``undoes``: the install a rollback undid. Other fields (the bundle's name) ride along.
    """

    id: str
    parent: str | None
    created: str
    kind: str
    changed: tuple[str, ...] = ()
    undoes: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any, folder: str) -> Record | None:
        """The record, or None for anything that is not one (wrong types, a foreign id)."""
        if not isinstance(data, dict) or data.get("id") != folder:
            return None
        if not all(isinstance(data.get(name), str) for name in _TEXT):
            return None
        parent, undoes = data.get("parent"), data.get("undoes")
        if not (parent is None or (isinstance(parent, str) and _GEN.fullmatch(parent))):
            return None
        if parent is not None and _number(parent) >= _number(folder):
            return None  # parents are older: a chain never loops
        if not (undoes is None or isinstance(undoes, str)):
            return None
        changed = data.get("changed", [])
        if not isinstance(changed, list) or not all(map(_is_entry_path, changed)):
            return None  # a rollback unlinks these paths: only entry paths inside the folder
        known = {*_TEXT, "parent", "undoes", "changed"}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(data["id"], parent, data["created"], data["kind"], tuple(changed), undoes, extra)

    def to_json(self) -> dict[str, Any]:
        out = {**self.extra, "id": self.id, "parent": self.parent, "created": self.created}
        out["kind"] = self.kind
        if self.changed or self.kind == "install":
            out["changed"] = list(self.changed)
        if self.undoes is not None:
            out["undoes"] = self.undoes
        return out


@dataclass(frozen=True)
class Generation:
    """A sealed generation as a store lists it: its record, and whether it is current."""

    record: Record
    current: bool = False

    @property
    def bundle(self) -> Mapping[str, Any]:
        """What an install's record says of its bundle (name, version, sha256); {} else."""
        about = self.record.extra.get("bundle")
        return about if isinstance(about, dict) else {}


def _is_entry_path(value: object) -> bool:
    if not isinstance(value, str) or not value.endswith(".json") or "\\" in value:
        return False
    path = PurePosixPath(value)
    return not path.is_absolute() and ".." not in path.parts and len(path.parts) >= 2


def number(gen: Path) -> int:
    return _number(gen.name)


def _number(name: str) -> int:
    match = _GEN.fullmatch(name)
    return int(match.group(1)) if match else -1


def generation_dirs(root: Path) -> list[Path]:
    """Every ``gen-NNNNNN`` folder under ``root``, oldest first."""
    try:
        found = [p for p in root.iterdir() if _GEN.fullmatch(p.name) and is_real_dir(p)]
    except OSError:
        return []
    return sorted(found, key=number)


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def read_record(gen: Path) -> Record | None:
    """The generation's record, or None when it is missing or is not one (unsealed)."""
    try:
        data = atomic.loads(atomic.read_bounded(gen / GENERATION_FILE, MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return None
    return Record.parse(data, gen.name)


def record_unreadable(gen: Path) -> bool:
    """Whether the generation's record is there but cannot be read now (EIO, EACCES): no
    sign that it is unsealed, so nothing may delete the generation for it."""
    try:
        atomic.read_bounded(gen / GENERATION_FILE, MAX_RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return False
    except OSError as e:
        return e.errno not in (errno.ELOOP, errno.EISDIR)
    return False


def linked(root: Path) -> Path | None:
    """The generation ``current`` names, when it is a link to a generation folder."""
    link = root / CURRENT
    try:
        name = os.readlink(link)
    except OSError:
        return None
    gen = root / name
    if not _GEN.fullmatch(name) or not is_real_dir(gen):
        return None
    return gen


def current(root: Path) -> Path | None:
    """The generation readers see: the one ``current`` links to or, while that link is
    missing or broken, the one a repair would restore (never an empty view)."""
    folder = root / CURRENT  # a copy tool may have made the link a folder
    return linked(root) or (folder if is_real_dir(folder) else fallback(root))


def listed(root: Path) -> list[Generation]:
    """Every sealed generation of the store at ``root``, oldest first, the one readers
    see (:func:`current`) marked."""
    in_use = current(root)
    out = []
    for gen in generation_dirs(root):
        record = read_record(gen)
        if record is not None:
            is_current = in_use is not None and gen.name == in_use.name
            out.append(Generation(record, current=is_current))
    return out


def fallback(root: Path) -> Path | None:
    """The generation a broken ``current`` stands for: the sealed one written last (its
    ``.stamp`` is replaced on every write, so an install that crashed before its swap
    loses to the generation puts went on to), else the newest one holding entries, else
    None (a store never written)."""
    gens = generation_dirs(root)
    sealed = [g for g in gens if read_record(g) is not None]
    if sealed:
        return max(sealed, key=lambda g: (_stamped(g), number(g)))
    holding = [g for g in gens if next(entry_files(g), None) is not None]
    return holding[-1] if holding else None


def _stamped(gen: Path) -> int:
    try:
        return (gen / STAMP_FILE).lstat().st_mtime_ns
    except OSError:
        return -1


def entry_files(gen: Path) -> Iterator[Path]:
    """Every entry file of a generation (``*.json``, not the record, not hidden)."""
    for dirpath, _dirs, files in os.walk(gen):
        for name in files:
            if name.endswith(".json") and name != GENERATION_FILE and not name.startswith("."):
                yield Path(dirpath) / name


def entry_paths(gen: Path) -> set[str]:
    """The entry files of ``gen`` as paths relative to it."""
    return {p.relative_to(gen).as_posix() for p in entry_files(gen)}


def temp_files(root: Path) -> Iterator[Path]:
    """Leftovers of an atomic write whose process died (``.tmp-*``), anywhere under root."""
    for dirpath, dirs, files in os.walk(root):
        for name in (*files, *dirs):
            if name.startswith(atomic.TEMP_PREFIX):
                yield Path(dirpath) / name


__all__ = [
    "CURRENT",
    "GENERATION_FILE",
    "STAMP_FILE",
    "Record",
    "current",
    "entry_files",
    "entry_paths",
    "fallback",
    "generation_dirs",
    "is_real_dir",
    "linked",
    "read_record",
    "temp_files",
]
