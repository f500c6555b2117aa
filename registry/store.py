"""The on-disk store of tuned configs.

Layout under the root (a person can read it)::

    current -> gen-000004                        one rename swaps generations
    gen-000004/GENERATION.json                   what made this generation, its parent
    gen-000004/.stamp                            replaced on every write: cheap change detection
    gen-000004/<kernel>/<gpu>/<software>/<shape>-<keyhash>.json
    quarantine/                                  corrupt files moved aside, never deleted
    .store.lock                                  serialises writers (fcntl)

A put writes one entry file atomically into the current generation. A bundle install
builds the next generation from hard links plus the bundle's entries, then swaps
``current``: readers see all of it or none of it, and the previous generation stays
for ``rollback``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock
from filelock import Timeout as FileLockTimeout

from registry import atomic
from registry.entry import Entry, canonical_key, now_iso
from registry.errors import RegistryError
from registry.fingerprint import Fingerprint, MatchPolicy

log = logging.getLogger(__name__)

CURRENT = "current"
GENERATION_FILE = "GENERATION.json"
STAMP_FILE = ".stamp"
QUARANTINE = "quarantine"
_GEN = re.compile(r"^gen-(\d{6,})$")
KEEP_GENERATIONS = 8


@dataclass
class _Loaded:
    """Parsed entries of one generation, with the file stats that let a reload skip them."""

    version: tuple[object, ...] = ()
    by_slot: dict[tuple[str, str], dict[str, Entry]] = field(default_factory=dict)
    by_path: dict[str, tuple[tuple[int, int, int], Entry]] = field(default_factory=dict)


class Store:
    """Tuned configs on disk; lookups are dict accesses after a load.

    Readers call :meth:`lookup`, which reloads when another process changed the store
    (one ``readlink`` and one ``stat``, at most every ``check_interval`` seconds).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = 120.0,
        check_interval: float = 0.0,
        keep_generations: int = KEEP_GENERATIONS,
    ) -> None:
        self.root = Path(root)
        self.lock_timeout = lock_timeout
        self.check_interval = check_interval
        self.keep_generations = max(2, keep_generations)
        self.quarantined = 0
        self.skipped = 0
        self._loaded = _Loaded()
        self._checked_at = -1.0
        self._lock = FileLock(str(self.root / ".store.lock"), timeout=lock_timeout)

    # ---- reading -------------------------------------------------------------------

    def lookup(
        self,
        kernel: str,
        key: Mapping[str, Any],
        fingerprint: Fingerprint,
        policy: MatchPolicy = MatchPolicy.EXACT,
    ) -> Entry | None:
        """The entry for ``kernel`` at ``key`` valid for ``fingerprint``, or None (a miss)."""
        self.refresh()
        candidates = self._loaded.by_slot.get((kernel, canonical_key(key)), {})
        exact = candidates.get(fingerprint.digest())
        if exact is not None:
            return exact
        matching = [
            e for e in candidates.values() if not fingerprint.mismatches(e.fingerprint, policy)
        ]
        if not matching:
            return None
        return min(matching, key=lambda e: (len(fingerprint.diff(e.fingerprint)), e.identity()))

    def explain_miss(
        self, kernel: str, key: Mapping[str, Any], fingerprint: Fingerprint
    ) -> list[dict[str, tuple[object, object]]]:
        """For a miss: the fields in which each stored entry of this slot differs."""
        self.refresh()
        candidates = self._loaded.by_slot.get((kernel, canonical_key(key)), {})
        return [fingerprint.diff(e.fingerprint) for e in candidates.values()]

    def entries(self) -> list[Entry]:
        """Every loaded entry, in path order."""
        self.refresh()
        return [e for _, (_, e) in sorted(self._loaded.by_path.items())]

    def __len__(self) -> int:
        self.refresh()
        return len(self._loaded.by_path)

    @property
    def version(self) -> tuple[object, ...]:
        """What the loaded entries were read from (generation, stamp): equal versions,
        equal entries. A reader that built something from them compares it later."""
        return self._loaded.version

    def refresh(self, *, force: bool = False) -> bool:
        """Reload if the store changed since the last load; True when it did."""
        now = time.monotonic()
        if not force and self._checked_at >= 0 and now - self._checked_at < self.check_interval:
            return False
        self._checked_at = now
        version = self._version()
        if not force and version == self._loaded.version and version:
            return False
        self._loaded = self._load(version)
        return True

    def current_generation(self) -> Path | None:
        try:
            name = os.readlink(self.root / CURRENT)
        except OSError:
            return None
        return self.root / name

    def generation_info(self, generation: Path | None = None) -> dict[str, Any]:
        generation = generation or self.current_generation()
        if generation is None:
            return {}
        try:
            return dict(json.loads((generation / GENERATION_FILE).read_text()))
        except (OSError, ValueError):
            return {}

    def generations(self) -> list[dict[str, Any]]:
        """Every complete generation's record, oldest first, with ``current`` marked."""
        current = self.current_generation()
        out = []
        for gen in self._generation_dirs():
            info = self.generation_info(gen)
            if info:
                out.append({**info, "current": current is not None and gen.name == current.name})
        return out

    def _version(self) -> tuple[object, ...]:
        gen = self.current_generation()
        if gen is None:
            return ()
        try:
            st = os.stat(gen / STAMP_FILE)
        except OSError:
            return (gen.name,)
        return (gen.name, st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self, version: tuple[object, ...]) -> _Loaded:
        gen = self.current_generation()
        loaded = _Loaded(version=version)
        if gen is None:
            return loaded
        previous = self._loaded.by_path
        for path in _entry_files(gen):
            rel = path.relative_to(gen).as_posix()
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # replaced or quarantined while we walked
            stat_key = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = previous.get(rel)
            entry = cached[1] if cached and cached[0] == stat_key else self._read(gen, path)
            if entry is None:
                continue
            loaded.by_path[rel] = (stat_key, entry)
            slot = loaded.by_slot.setdefault((entry.kernel, entry.key_json), {})
            slot[entry.fingerprint.digest()] = entry
        return loaded

    def _read(self, gen: Path, path: Path) -> Entry | None:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._quarantine(gen, path, f"unreadable JSON: {e}")
            return None
        if isinstance(data, dict) and isinstance(data.get("schema"), int) and data["schema"] > 1:
            self.skipped += 1  # written by a newer version sharing the volume: leave it alone
            log.warning("skipping %s: schema %s is newer than this reader", path, data["schema"])
            return None
        try:
            return Entry.from_json(data)
        except RegistryError as e:
            self._quarantine(gen, path, str(e))
            return None

    def _quarantine(self, gen: Path, path: Path, reason: str) -> None:
        """Move a corrupt file aside so readers stop tripping on it; its key becomes a miss."""
        self.quarantined += 1
        rel = path.relative_to(gen).as_posix().replace("/", "__")
        target = self.root / QUARANTINE / f"{time.strftime('%Y%m%dT%H%M%S')}-{gen.name}-{rel}"
        log.error("quarantining corrupt registry file %s (%s) -> %s", path, reason, target)
        try:
            with self._locked():
                if self._still_corrupt(path):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, target)
                    atomic.write_bytes(target.with_name(target.name + ".reason"), reason.encode())
        except (OSError, RegistryError) as e:  # a read-only mount: count it, skip it
            log.warning("could not move %s to quarantine: %s", path, e)

    @staticmethod
    def _still_corrupt(path: Path) -> bool:
        try:
            Entry.from_json(json.loads(path.read_bytes()))
        except FileNotFoundError:
            return False
        except (OSError, ValueError, RegistryError):
            return True
        return False  # a writer replaced it with a good file meanwhile

    # ---- writing -------------------------------------------------------------------

    def put(self, entry: Entry) -> Entry:
        """Merge ``entry`` into the store atomically; returns what is stored for its slot."""
        return self.put_many([entry])[0]

    def put_many(self, entries: Iterable[Entry]) -> list[Entry]:
        """Merge many entries under one lock; each file is replaced atomically."""
        with self._locked():
            gen = self._ensure_generation()
            stored = [self._merge_into(gen, e) for e in entries]
            self._touch_stamp(gen)
        self.refresh(force=True)
        return stored

    def install(self, entries: Iterable[Entry], *, record: Mapping[str, Any]) -> dict[str, Any]:
        """Make a new generation = current + ``entries`` and swap it in with one rename.

        ``record`` describes the change (a bundle's name and version); it lands in the
        generation's GENERATION.json together with the paths it changed, for rollback.
        """
        entries = list(entries)
        with self._locked():
            parent = self._ensure_generation()
            new = self._fork(parent)
            changed = sorted({e.relpath().as_posix() for e in entries})
            for e in entries:
                self._merge_into(new, e)
            info = self._seal(new, parent, {"kind": "install", **record, "changed": changed})
            self._swap(new)
        self.refresh(force=True)
        return info

    def rollback(self) -> dict[str, Any]:
        """Undo the latest bundle install not yet undone, keeping every other change."""
        with self._locked():
            current = self._ensure_generation()
            target = self._latest_undoable_install(current)
            parent = self.root / str(target["parent"])
            if not (parent / GENERATION_FILE).exists():
                raise RegistryError(
                    f"Cannot roll back {target['id']}: its parent generation "
                    f"{target['parent']} is gone (kept: {self.keep_generations})."
                )
            new = self._fork(current)
            for rel in target.get("changed", []):
                _unlink_quiet(new / rel)
                if (parent / rel).exists():
                    (new / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.link(parent / rel, new / rel)
            info = self._seal(
                new,
                current,
                {"kind": "rollback", "undoes": target["id"], "bundle": target.get("bundle")},
            )
            self._swap(new)
        self.refresh(force=True)
        return info

    def _latest_undoable_install(self, current: Path) -> dict[str, Any]:
        undone: set[str] = set()
        gen: Path | None = current
        while gen is not None and (info := self.generation_info(gen)):
            if info.get("kind") == "rollback":
                undone.add(str(info.get("undoes")))
            elif info.get("kind") == "install" and info["id"] not in undone:
                return info
            gen = self.root / str(info["parent"]) if info.get("parent") else None
        raise RegistryError(f"Store {self.root}: no bundle install left to roll back.")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            with self._lock:
                yield
        except FileLockTimeout:
            raise RegistryError(
                f"Store {self.root}: write lock not acquired within {self.lock_timeout:g} s."
            ) from None

    def _merge_into(self, gen: Path, entry: Entry) -> Entry:
        path = gen / entry.relpath()
        merged = entry
        with contextlib.suppress(FileNotFoundError, ValueError, RegistryError):
            merged = Entry.from_json(json.loads(path.read_bytes())).merge(entry)
        data = atomic.dumps(merged.to_json()).encode()
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == data:
                return merged  # an idempotent replay writes nothing
        atomic.write_bytes(path, data)
        return merged

    def _ensure_generation(self) -> Path:
        gen = self.current_generation()
        if gen is not None and (gen / GENERATION_FILE).exists():
            return gen
        first = self._new_generation_dir()
        self._seal(first, None, {"kind": "init"})
        self._swap(first)
        return first

    def _fork(self, parent: Path) -> Path:
        """A new generation holding hard links to every entry file of ``parent``."""
        new = self._new_generation_dir()
        for path in _entry_files(parent):
            dst = new / path.relative_to(parent)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, dst)
        return new

    def _new_generation_dir(self) -> Path:
        self._collect_garbage()
        numbers = [int(m.group(1)) for p in self.root.iterdir() if (m := _GEN.match(p.name))]
        new = self.root / f"gen-{max(numbers, default=0) + 1:06d}"
        new.mkdir(parents=True)
        return new

    def _seal(self, gen: Path, parent: Path | None, record: Mapping[str, Any]) -> dict[str, Any]:
        info = {
            "id": gen.name,
            "parent": parent.name if parent else None,
            "created": now_iso(),
            **record,
        }
        self._touch_stamp(gen)
        atomic.write_json(gen / GENERATION_FILE, info)
        return info

    def _swap(self, gen: Path) -> None:
        atomic.replace_symlink(self.root / CURRENT, gen.name)
        log.info("store %s: current generation is now %s", self.root, gen.name)

    @staticmethod
    def _touch_stamp(gen: Path) -> None:
        atomic.write_bytes(gen / STAMP_FILE, secrets.token_hex(8).encode())

    def _generation_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        dirs = [p for p in self.root.iterdir() if _GEN.match(p.name) and p.is_dir()]
        return sorted(dirs, key=lambda p: int(p.name[4:]))

    def _collect_garbage(self) -> None:
        """Drop unsealed generations (a crashed install) and all but the newest kept ones."""
        current = self.current_generation()
        keep_names = {current.name} if current else set()
        sealed = [g for g in self._generation_dirs() if (g / GENERATION_FILE).exists()]
        keep_names.update(g.name for g in sealed[-self.keep_generations :])
        for gen in self._generation_dirs():
            if gen.name not in keep_names:
                shutil.rmtree(gen, ignore_errors=True)


def _entry_files(gen: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(gen):
        for name in files:
            if name.endswith(".json") and name != GENERATION_FILE and not name.startswith("."):
                yield Path(dirpath) / name


def _unlink_quiet(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
