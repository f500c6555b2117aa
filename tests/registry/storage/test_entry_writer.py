import errno
import json
import os

import pytest

from registry import RegistryError
from registry.core import atomic
from registry.core.entry import SCHEMA_VERSION, Entry
from registry.core.errors import Superseded
from registry.storage.entry_writer import EntryWriter, Fence, seen
from registry.storage.quarantine import QUARANTINE, Quarantine


@pytest.fixture
def gen(tmp_path):
    folder = tmp_path / "gen-000001"
    folder.mkdir()
    return folder


def _writer(root):
    return EntryWriter(root, Quarantine(root))


def test_a_merge_writes_a_new_entry_and_a_replay_writes_nothing(tmp_path, gen, make_entry):
    writer, entry = _writer(tmp_path), make_entry()
    assert writer.merge_into(gen, entry) == entry
    path = gen / entry.relpath()
    assert Entry.from_json(json.loads(path.read_text())) == entry
    before = path.stat()
    assert writer.merge_into(gen, entry) == entry
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_merge_keeps_what_the_file_held(tmp_path, gen, make_entry):
    writer = _writer(tmp_path)
    earlier = make_entry(block_m=64, created="2026-01-01T00:00:00+00:00")
    writer.merge_into(gen, earlier)
    merged = writer.merge_into(gen, make_entry(block_m=256))
    assert merged.best.meta["BLOCK_M"] == 64  # the earliest tuning wins
    held = {m.config.meta["BLOCK_M"] for m in merged.measurements}
    assert {32, 64, 128, 256} <= held  # the measurements of both
    assert Entry.from_json(json.loads((gen / merged.relpath()).read_text())) == merged


def test_a_corrupt_file_is_quarantined_and_counted_before_the_write(tmp_path, gen, make_entry):
    writer, entry = _writer(tmp_path), make_entry()
    path = gen / entry.relpath()
    path.parent.mkdir(parents=True)
    path.write_text("{")
    assert writer.merge_into(gen, entry) == entry
    assert writer.quarantine.moved == 1
    (kept,) = (tmp_path / QUARANTINE).glob(f"*{gen.name}-{path.name}")
    assert kept.read_text() == "{"


def test_a_newer_versions_entry_keeps_its_slot(tmp_path, gen, make_entry, caplog):
    writer, entry = _writer(tmp_path), make_entry()
    path = gen / entry.relpath()
    path.parent.mkdir(parents=True)
    newer = {**entry.to_json(), "schema": SCHEMA_VERSION + 1, "future": True}
    path.write_text(json.dumps(newer))
    assert writer.merge_into(gen, make_entry(block_m=32)).best.meta["BLOCK_M"] == 32
    assert json.loads(path.read_text()) == newer and writer.quarantine.moved == 0
    assert "a newer version's entry holds the slot" in caplog.text


def test_a_read_that_fails_fails_the_merge(tmp_path, gen, make_entry, monkeypatch):
    writer, entry = _writer(tmp_path), make_entry()
    writer.merge_into(gen, entry)
    before = (gen / entry.relpath()).read_bytes()

    def eio(path, limit, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic, "read_bounded", eio)
    with pytest.raises(OSError):
        writer.merge_into(gen, make_entry(block_m=32))
    monkeypatch.undo()
    assert (gen / entry.relpath()).read_bytes() == before


@pytest.mark.parametrize("where", ["a file where a folder belongs", "a folder at the entry"])
def test_what_stands_in_an_entrys_way_goes_to_quarantine_uncounted(
    tmp_path, gen, make_entry, where
):
    writer, entry = _writer(tmp_path), make_entry()
    path = gen / entry.relpath()
    if where == "a folder at the entry":
        (path / "inside").mkdir(parents=True)
    else:
        (gen / entry.relpath().parts[0]).write_text("x")
    assert writer.merge_into(gen, entry) == entry and path.is_file()
    assert writer.quarantine.moved == 0 and writer.quarantine.count() == 1


def test_a_fence_lands_only_on_the_bytes_it_saw_and_guards_its_own_entry(tmp_path, gen, make_entry):
    writer, entry = _writer(tmp_path), make_entry()
    rel = entry.relpath().as_posix()
    empty = Fence(rel, seen(gen / rel))
    writer.check_fence(gen, [entry], empty)  # nothing there, nothing written since
    writer.merge_into(gen, entry)
    with pytest.raises(Superseded):
        writer.check_fence(gen, [entry], empty)
    now = Fence(rel, seen(gen / rel))
    writer.check_fence(gen, [entry], now)
    with pytest.raises(RegistryError, match="guards a put of that entry alone"):
        writer.check_fence(gen, [entry, make_entry(m=1)], now)
    with pytest.raises(RegistryError, match="guards a put of that entry alone"):
        writer.check_fence(gen, [make_entry(m=1)], now)


def test_seen_is_a_digest_of_the_bytes_or_says_what_is_no_entry(tmp_path):
    assert seen(tmp_path / "missing.json") == ""
    assert seen(tmp_path / "missing" / "below.json") == ""
    (tmp_path / "a.json").write_text("one")
    (tmp_path / "b.json").write_text("one")
    (tmp_path / "c.json").write_text("two")
    assert seen(tmp_path / "a.json") == seen(tmp_path / "b.json") != seen(tmp_path / "c.json")
    assert len(seen(tmp_path / "a.json")) == 32
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "a.json")
    for name in ("folder.json", "fifo.json", "link.json"):
        assert seen(tmp_path / name).startswith("no entry: ")


def test_a_fence_travels_as_json():
    fence = Fence("ag_gemm/x.json", "abc")
    assert Fence.from_json(json.loads(json.dumps(fence.to_json()))) == fence
