"""A family's part of a bundle: its files staged beside their folder and moved in after
the swap, and a new family's files carried by bundles with no change to them."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import BundleRejected, Store, families
from registry.bundles import bundle
from registry.families.base import Family
from registry.families.bundle_parts import BundlePart, Packed, Stage
from tests.registry._bundles import UNSIGNED_OK


def test_a_stage_moves_its_files_in_or_leaves_nothing_behind(tmp_path):
    root = tmp_path / "made" / "family"
    stage = Stage(root)
    stage.write("b.tgz", "a/one.bin", [b"1", b"2"])
    assert not (root / "a" / "one.bin").exists()  # staged, not in place
    stage.commit(["a/one.bin"])
    assert (root / "a" / "one.bin").read_bytes() == b"12" and stage.moved == ["a/one.bin"]
    stage.discard(failed=False)
    assert [p.name for p in root.iterdir()] == ["a"]  # the staging folder is gone

    failed = Stage(tmp_path / "other" / "family")
    failed.write("b.tgz", "x.bin", [b"x"])
    failed.discard(failed=True)
    assert not (tmp_path / "other").exists()  # the folders it made go too


def test_a_file_cannot_replace_a_folder(tmp_path):
    (tmp_path / "family" / "a").mkdir(parents=True)
    with pytest.raises(BundleRejected, match="cannot replace"):
        Stage(tmp_path / "family").write("b.tgz", "a", [b"x"])


class Notes(BundlePart):
    """A family's files in a bundle, as a new family would add them: ``notes/<file>``."""

    prefix = "notes/"
    what = "notes"
    counted = "notes"
    option = "notes"

    def pack(self, root: Path, *, only: str | None = None) -> Packed:
        files = sorted(p for p in root.iterdir() if p.is_file())
        return Packed(members={f"{self.prefix}{p.name}": p for p in files})

    def limit(self, label, name, limits):
        if name.count("/") != 1:
            raise BundleRejected(label, f"note '{name}' is not notes/<file>")
        return "note", 64


class NotesFamily(Family):
    name, order, bundled = "notes", 90, Notes()


def test_a_new_familys_files_travel_by_bundle_with_no_change_to_bundles(tmp_path, monkeypatch):
    known = families.every()
    monkeypatch.setattr(families, "every", lambda: (*known, NotesFamily()))
    source = tmp_path / "notes"
    source.mkdir()
    (source / "a.txt").write_bytes(b"kept for the fleet")
    out = tmp_path / "n.tgz"
    manifest = bundle.create(out, name="n", version="1", entries=[], roots={"notes": source})
    assert list(manifest["members"]) == ["notes/a.txt"]
    assert bundle.verify(out, trust=UNSIGNED_OK).parts["notes"].files == ["a.txt"]
    store = Store(tmp_path / "store", create=True)
    with pytest.raises(BundleRejected, match="no notes folder was given"):
        bundle.install(out, store, expect=None, trust=UNSIGNED_OK)
    target = tmp_path / "volume" / "notes"
    info = bundle.install(out, store, expect=None, roots={"notes": target}, trust=UNSIGNED_OK)
    assert info["notes"] == 1 and (target / "a.txt").read_bytes() == b"kept for the fleet"
    big = source / "big.txt"
    big.write_bytes(b"x" * 65)
    bundle.create(out, name="n", version="2", entries=[], roots={"notes": source})
    with pytest.raises(BundleRejected, match=r"note 'notes/big\.txt' is 65 bytes; limit 64"):
        bundle.verify(out, trust=UNSIGNED_OK)
