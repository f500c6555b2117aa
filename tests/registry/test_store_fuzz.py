"""Any bytes on disk are survivable: thousands of spoiled stores, each still answers.

Every case copies one healthy store, spoils one stored file (an entry, a generation
record, the stamp, the ``current`` link) by truncation, bit flips, a wrong-typed field,
a deep nest or removal, then reads, writes, installs and recovers. No operation may
raise, and every entry the spoiling did not touch must still be found.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry import Store
from registry.storage.generations import CURRENT, GENERATION_FILE, STAMP_FILE, entry_files
from tests.spoil import MUTATIONS

CASES = 2000


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, make_entry) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("healthy")
    store = Store(root, create=True)
    store.put_many([make_entry(m=m) for m in range(1, 7)])
    store.install([make_entry(m=m) for m in (7, 8)], record={"bundle": {"name": "b"}})
    return root, store.entries()


def _targets(root: Path) -> list[Path]:
    gens = sorted(root.glob("gen-*"))
    return [
        root / CURRENT,
        *(g / GENERATION_FILE for g in gens),
        *(g / STAMP_FILE for g in gens),
        *(p for g in gens for p in entry_files(g)),
    ]


def _spoil(path: Path, rng: random.Random) -> str:
    if path.name == CURRENT:
        choice = rng.choice(["remove", "dangle", "file", "stray"])
        path.unlink()
        if choice == "dangle":
            path.symlink_to("gen-000777")
        elif choice == "file":
            path.write_bytes(rng.randbytes(20))
        elif choice == "stray":
            path.symlink_to("..")
        return f"current: {choice}"
    if rng.random() < 0.08:
        path.unlink()
        return f"{path.name}: removed"
    name, mutate = rng.choice(list(MUTATIONS.items()))
    data = path.read_bytes()
    path.unlink()  # generations share entry files by hard link: spoil this path only
    path.write_bytes(mutate(data, rng))
    return f"{path.relative_to(path.parents[len(path.parents) - 1])}: {name}"


@pytest.fixture
def scratch(tmp_path) -> Iterator[Path]:
    """Memory-backed where the machine has it: the cases fsync thousands of files."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="store-fuzz-", dir=shm))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_two_thousand_spoiled_stores_each_still_answer(scratch, healthy, make_entry):
    base, entries = healthy
    rng = random.Random(20261123)
    for case in range(CASES):
        root = scratch / f"case-{case}"
        shutil.copytree(base, root, symlinks=True)
        target = rng.choice(_targets(root))
        touched = target.relative_to(root).as_posix()
        how = _spoil(target, rng)
        try:
            _check(root, entries, touched, make_entry, heavy=case % 10 == 0)
        except Exception as e:  # name the case, so a failure can be replayed
            raise AssertionError(f"case {case} ({how}): {type(e).__name__}: {e}") from e
        shutil.rmtree(root)


def _check(root: Path, entries: list, touched: str, make_entry, *, heavy: bool) -> None:
    current = os.readlink(root / CURRENT) if (root / CURRENT).is_symlink() else None
    spoiled_entry = (
        touched.startswith(f"{current}/")
        and touched.endswith(".json")
        and (not touched.endswith(GENERATION_FILE))
    )
    reader = Store(root, create=True)
    survivors = [e for e in entries if not (spoiled_entry and touched.endswith(e.relpath().name))]
    for entry in entries:
        found = reader.lookup(entry.kernel, entry.key, entry.fingerprint)
        if entry in survivors:
            assert found == entry, f"lost {entry.relpath()}"
    extra = make_entry(m=1000)
    assert reader.put(extra) == extra
    if heavy:
        reader.install([make_entry(m=1001)], record={"bundle": {"name": "fuzz"}})
        reader.recover()
    again = Store(root, create=True)
    for entry in [*survivors, extra]:
        assert again.lookup(entry.kernel, entry.key, entry.fingerprint) == entry
