import errno
import os

import pytest

from registry import RegistryError
from registry.core import atomic
from registry.storage.entry_writer import EntryWriter
from registry.storage.generation_writer import GenerationWriter
from registry.storage.generations import (
    CURRENT,
    GENERATION_FILE,
    STAMP_FILE,
    entry_paths,
    generation_dirs,
    linked,
    read_record,
)
from registry.storage.quarantine import QUARANTINE, Quarantine


def _generations(root, *, keep=8):
    quarantine = Quarantine(root)
    return GenerationWriter(root, EntryWriter(root, quarantine), quarantine, keep=keep)


def _put(gens, *entries):
    """What a put does under the lock: into the current generation, then a new stamp."""
    gen = gens.ensure()
    for entry in entries:
        gens.writer.merge_into(gen, entry)
    gens.touch_stamp(gen)
    return gen


def _rel(entry):
    return entry.relpath().as_posix()


def test_a_fresh_store_gets_an_empty_sealed_generation_and_nothing_to_report(tmp_path):
    gens = _generations(tmp_path)
    assert gens.repair() == ""
    gen = linked(tmp_path)
    assert gen is not None and gen.name == "gen-000001"
    assert read_record(gen).kind == "init" and (gen / STAMP_FILE).is_file()
    assert gens.repair() == "" and gens.ensure() == gen


def test_an_install_forks_seals_and_swaps_leaving_its_parent_as_it_was(tmp_path, make_entry):
    gens = _generations(tmp_path)
    parent = _put(gens, make_entry(m=1))
    info = gens.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    new = linked(tmp_path)
    assert new.name == info["id"] != parent.name
    record = read_record(new)
    assert (record.kind, record.parent, record.changed) == (
        "install",
        parent.name,
        (_rel(make_entry(m=2)),),
    )
    assert record.extra["bundle"] == {"name": "b"}
    kept = _rel(make_entry(m=1))
    assert os.path.samefile(new / kept, parent / kept)  # a hard link, not a copy
    assert entry_paths(parent) == {kept} and entry_paths(new) == {kept, _rel(make_entry(m=2))}


def test_an_install_runs_before_seal_into_its_record_and_after_swap_once_swapped(
    tmp_path, make_entry, caplog
):
    gens = _generations(tmp_path)
    _put(gens, make_entry(m=1))
    seen = []

    def after_swap():
        seen.append(os.readlink(tmp_path / CURRENT))
        raise OSError("disk full")

    info = gens.install(
        [make_entry(m=2)],
        record={"bundle": {"name": "b"}},
        after_swap=after_swap,
        before_seal=lambda: {"replaces": ["x"]},
    )
    assert seen == [info["id"]] and os.readlink(tmp_path / CURRENT) == info["id"]
    assert read_record(tmp_path / info["id"]).extra["replaces"] == ["x"]
    assert "its after-swap step failed" in caplog.text and "disk full" in caplog.text


def test_a_rollback_restores_the_parents_files_and_keeps_later_changes(tmp_path, make_entry):
    gens = _generations(tmp_path)
    _put(gens, make_entry(m=1, block_m=64))
    installed = gens.install(
        [make_entry(m=1, block_m=32, created="2026-01-01T00:00:00+00:00"), make_entry(m=2)],
        record={"bundle": {"name": "b"}},
    )
    _put(gens, make_entry(m=3))  # a tuning after the install
    undone = []
    info = gens.rollback(after_swap=lambda record: undone.append(record.id))
    current = linked(tmp_path)
    assert info["undoes"] == installed["id"] == undone[0] and current.name == info["id"]
    assert entry_paths(current) == {_rel(make_entry(m=1)), _rel(make_entry(m=3))}
    parent = tmp_path / installed["parent"]
    assert os.path.samefile(current / _rel(make_entry(m=1)), parent / _rel(make_entry(m=1)))
    with pytest.raises(RegistryError, match="no bundle install left to roll back"):
        gens.rollback()


def test_a_rollback_past_a_repaired_generation_or_a_lost_parent_refuses(tmp_path, make_entry):
    gens = _generations(tmp_path)
    _put(gens, make_entry(m=1))
    first = gens.install([make_entry(m=2)], record={"bundle": {"name": "a"}})
    (linked(tmp_path) / GENERATION_FILE).unlink()  # what it changed is lost
    with pytest.raises(RegistryError, match="was repaired"):
        gens.rollback()
    second = gens.install([make_entry(m=3)], record={"bundle": {"name": "b"}})
    assert read_record(tmp_path / second["id"]).parent == first["id"]
    (tmp_path / first["id"] / GENERATION_FILE).unlink()
    with pytest.raises(RegistryError, match=f"parent generation {first['id']} is gone"):
        gens.rollback()


def test_a_missing_record_is_resealed_and_a_broken_one_kept_aside(tmp_path, make_entry):
    gens = _generations(tmp_path)
    gen = _put(gens, make_entry(m=1))
    (gen / GENERATION_FILE).write_text("{")
    assert gens.repair() == f"resealed {gen.name}"
    record = read_record(gen)
    assert record.kind == "repair" and entry_paths(gen) == {_rel(make_entry(m=1))}
    (kept,) = (tmp_path / QUARANTINE).glob(f"*{gen.name}-{GENERATION_FILE}")
    assert kept.read_text() == "{"


def test_a_broken_current_points_at_the_generation_written_last(tmp_path, make_entry):
    gens = _generations(tmp_path)
    _put(gens, make_entry(m=1))
    installed = gens.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    (tmp_path / CURRENT).unlink()
    (tmp_path / CURRENT).symlink_to("gen-000099")
    assert gens.repair() == f"pointed 'current' at {installed['id']}"
    assert os.readlink(tmp_path / CURRENT) == installed["id"]


def test_a_copied_current_folder_is_adopted_as_a_new_generation(tmp_path, make_entry):
    gens = _generations(tmp_path)
    gen = _put(gens, make_entry(m=1))
    (tmp_path / CURRENT).unlink()
    os.rename(gen, tmp_path / CURRENT)  # a copy tool that followed the link
    done = gens.repair()
    adopted = linked(tmp_path)
    assert done == f"adopted the folder 'current' as {adopted.name}"
    assert read_record(adopted).kind == "repair"
    assert entry_paths(adopted) == {_rel(make_entry(m=1))}


def test_a_swap_that_fails_unseals_the_new_generation(tmp_path, make_entry, monkeypatch):
    gens = _generations(tmp_path)
    current = _put(gens, make_entry(m=1))

    def full_disk(link, target):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "replace_symlink", full_disk)
    with pytest.raises(OSError):
        gens.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    (new,) = (g for g in generation_dirs(tmp_path) if g != current)
    assert read_record(new) is None and linked(tmp_path) == current


def test_new_generations_are_numbered_past_every_name(tmp_path):
    gens = _generations(tmp_path)
    (tmp_path / "gen-000041").write_text("a stray file")
    (tmp_path / "gen-²").mkdir()
    assert gens.new_dir().name == "gen-000042"
    assert gens.new_dir().name == "gen-000043"


def test_a_folder_where_the_stamp_belongs_is_quarantined_and_counted(tmp_path, make_entry):
    gens = _generations(tmp_path)
    gen = _put(gens, make_entry(m=1))
    (gen / STAMP_FILE).unlink()
    (gen / STAMP_FILE).mkdir()
    gens.touch_stamp(gen)
    assert (gen / STAMP_FILE).is_file() and gens.quarantine.moved == 1
    assert list((tmp_path / QUARANTINE).glob(f"*{gen.name}-{STAMP_FILE}.reason"))


def test_a_writer_collects_garbage_through_its_collector_keeping_the_newest(tmp_path, make_entry):
    gens = _generations(tmp_path, keep=2)
    first = _put(gens, make_entry(m=1))
    gens.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    (linked(tmp_path) / make_entry(m=1).relpath()).unlink()  # lost from current by hand
    for i in range(4):
        gens.install([make_entry(m=10 + i)], record={"bundle": {"name": f"c{i}"}})
    done = gens.collect_garbage()
    names = [g.name for g in generation_dirs(tmp_path)]
    assert names == [first.name, "gen-000005", "gen-000006"]  # first: the only one with M=1
    assert done == {"removed": ["gen-000002", "gen-000003", "gen-000004"], "quarantined": []}
    assert gens.collect_garbage() == {"removed": [], "quarantined": []}
