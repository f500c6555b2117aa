"""A family's part of a bundle: a new family's files carried by bundles with no change
to them (staging: ``test_staging.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import BundleRejected, Store, families
from registry.bundles import bundle
from registry.families.base import Family
from registry.families.bundle_parts import BundlePart, Packed
from tests.registry._bundles import UNSIGNED_OK


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
