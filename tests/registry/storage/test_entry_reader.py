import errno
import json
import os

import pytest

from registry import RegistryError, Store
from registry.core import atomic
from registry.core.entry import SCHEMA_VERSION, NewerSchema
from registry.core.fingerprint import MatchPolicy
from registry.storage.entry_reader import UNREAD, EntryReader, Loaded, read_entry
from registry.storage.generations import CURRENT, STAMP_FILE
from registry.storage.quarantine import QUARANTINE, Quarantine
from registry.storage.write_lock import WriteLock


def _reader(root, *, timeout=5.0):
    quarantine = Quarantine(root)
    return EntryReader(root, WriteLock(root, quarantine, timeout=timeout, create=False), quarantine)


def _stored(root, make_entry, count=3):
    """A store of ``count`` entries (M = 1..count) and the folder of its generation."""
    Store(root).put_many([make_entry(m=m) for m in range(1, count + 1)])
    return root / os.readlink(root / CURRENT)


def _load(reader, previous=None):
    return reader.load(reader.version(), previous or Loaded())


def test_a_load_holds_every_entry_by_path_and_by_slot(tmp_path, make_entry, h200):
    gen = _stored(tmp_path, make_entry)
    loaded = _load(_reader(tmp_path))
    assert loaded.version[0] == gen.name and len(loaded.by_path) == 3
    entry = make_entry(m=2)
    held = loaded.by_path[entry.relpath().as_posix()][1]
    assert held.key == entry.key
    assert loaded.by_slot[("ag_gemm", entry.key_json)] == {h200.digest(): held}


def test_the_version_is_empty_for_a_store_never_written_and_follows_the_stamp(tmp_path, make_entry):
    reader = _reader(tmp_path)
    assert reader.version() == () and _load(reader) == Loaded()
    gen = _stored(tmp_path, make_entry)
    before = reader.version()
    atomic.write_bytes(gen / STAMP_FILE, b"another writer")
    assert reader.version() != before and reader.version()[0] == gen.name
    (gen / STAMP_FILE).unlink()
    assert reader.version() == (gen.name,)


def test_a_reload_reads_only_the_files_that_changed(tmp_path, make_entry, monkeypatch):
    gen = _stored(tmp_path, make_entry)
    reader = _reader(tmp_path)
    first = _load(reader)
    read = []
    real = reader.read
    monkeypatch.setattr(reader, "read", lambda g, p: read.append(p) or real(g, p))
    assert _load(reader, first).by_path == first.by_path and read == []
    changed = gen / make_entry(m=2).relpath()
    atomic.write_bytes(changed, atomic.dumps(make_entry(m=2, block_m=64).to_json()).encode())
    again = _load(reader, first)
    assert read == [changed]
    assert again.by_path[make_entry(m=2).relpath().as_posix()][1].best.meta["BLOCK_M"] == 64


def test_a_corrupt_file_is_quarantined_and_counted(tmp_path, make_entry):
    gen = _stored(tmp_path, make_entry)
    path = gen / make_entry(m=1).relpath()
    path.write_text("{")
    reader = _reader(tmp_path)
    loaded = _load(reader)
    assert len(loaded.by_path) == 2 and not path.exists()
    assert reader.quarantine.moved == 1 and reader.quarantine.count() == 1
    assert list((tmp_path / QUARANTINE).glob(f"*{gen.name}-ag_gemm__*.reason"))


def test_a_corrupt_file_stays_when_the_lock_is_busy_and_is_not_read_again(
    tmp_path, make_entry, caplog, monkeypatch
):
    gen = _stored(tmp_path, make_entry)
    path = gen / make_entry(m=1).relpath()
    path.write_text("{")
    holder, reader = _reader(tmp_path), _reader(tmp_path)
    monkeypatch.setattr("registry.storage.entry_reader.QUARANTINE_LOCK_S", 0.05)
    with holder.lock.hold():
        loaded = _load(reader)
    assert path.exists() and reader.quarantine.moved == 0
    assert "left in place" in caplog.text
    rel = make_entry(m=1).relpath().as_posix()
    assert rel in loaded.refused and rel not in loaded.by_path
    read = []
    monkeypatch.setattr(reader, "read", lambda g, p: read.append(p))
    assert rel in _load(reader, loaded).refused and read == []  # refused while unchanged


def test_a_newer_versions_entry_is_skipped_and_left_alone(tmp_path, make_entry):
    gen = _stored(tmp_path, make_entry)
    path = gen / make_entry(m=1).relpath()
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema": SCHEMA_VERSION + 1}))
    reader = _reader(tmp_path)
    assert len(_load(reader).by_path) == 2
    assert reader.skipped == 1 and reader.quarantine.moved == 0 and path.exists()


def test_a_file_that_cannot_be_read_now_is_read_again_at_the_next_load(
    tmp_path, make_entry, monkeypatch
):
    gen = _stored(tmp_path, make_entry)
    reader = _reader(tmp_path)
    real = atomic.read_bounded

    def eio(path, limit, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic, "read_bounded", eio)
    assert reader.read(gen, gen / make_entry(m=1).relpath()) is UNREAD
    loaded = _load(reader)
    assert loaded.by_path == {} and loaded.refused == {}  # no verdict on the file
    monkeypatch.setattr(atomic, "read_bounded", real)
    assert len(_load(reader, loaded).by_path) == 3 and reader.quarantine.moved == 0


def test_read_entry_tells_a_newer_schema_from_what_is_no_entry(tmp_path, make_entry):
    entry = make_entry()
    good = tmp_path / "good.json"
    good.write_text(atomic.dumps(entry.to_json()))
    assert read_entry(good) == (good.read_bytes(), entry)
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**entry.to_json(), "schema": SCHEMA_VERSION + 1}))
    with pytest.raises(NewerSchema):
        read_entry(newer)
    (tmp_path / "link.json").symlink_to(good)
    (tmp_path / "text.json").write_text("not json")
    for name in ("link.json", "text.json"):
        with pytest.raises(RegistryError):
            read_entry(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        read_entry(tmp_path / "missing.json")


def test_a_view_answers_a_slot_its_entries_in_path_order_and_a_layers_ms(
    tmp_path, make_entry, h200
):
    _stored(tmp_path, make_entry)
    loaded = _load(_reader(tmp_path))
    entry = make_entry(m=2)
    assert list(loaded.slot("ag_gemm", entry.key)) == [h200.digest()]
    assert loaded.slot("other", entry.key) == {}
    paths = [e.relpath().as_posix() for e in loaded.entries()]
    assert paths == sorted(paths) and len(paths) == 3
    layer = loaded.like("ag_gemm", entry.key, h200, MatchPolicy.EXACT, free="M")
    assert list(layer) == [1, 2, 3] and layer[2].key == entry.key
    assert loaded.like("other", entry.key, h200, MatchPolicy.EXACT, free="M") == {}


def test_a_view_holds_a_path_only_as_it_was_read_from_that_generation(tmp_path, make_entry):
    gen = _stored(tmp_path, make_entry)
    loaded = _load(_reader(tmp_path))
    rel = make_entry(m=1).relpath().as_posix()
    assert loaded.holds(gen, rel)
    assert not loaded.holds(tmp_path / "gen-999999", rel)  # another generation
    (gen / rel).unlink()
    assert not loaded.holds(gen, rel)  # gone since the load
    assert loaded.holds(gen, "ag_gemm/none.json")  # absent then and now: nothing to reload
