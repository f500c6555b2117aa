import os
import time

from registry.core import atomic
from registry.storage.generations import (
    CURRENT,
    GENERATION_FILE,
    STAMP_FILE,
    current,
    linked,
    listed,
)


def _generation(root, name, *, sealed=True, entry=True):
    gen = root / name
    (gen / "ag_gemm").mkdir(parents=True)
    if entry:
        (gen / "ag_gemm" / "x.json").write_text("{}")
    if sealed:
        record = {"id": name, "parent": None, "created": "now", "kind": "init"}
        atomic.write_json(gen / GENERATION_FILE, record)
    (gen / STAMP_FILE).write_text(name)
    return gen


def test_a_store_never_written_has_no_current_generation(tmp_path):
    assert current(tmp_path) is None


def test_current_is_the_linked_generation(tmp_path):
    _generation(tmp_path, "gen-000001")
    linked_one = _generation(tmp_path, "gen-000002")
    _generation(tmp_path, "gen-000003")  # newer, but not the one in use
    (tmp_path / CURRENT).symlink_to(linked_one.name)
    assert current(tmp_path) == linked(tmp_path) == linked_one


def test_without_a_link_current_is_the_sealed_generation_written_last(tmp_path):
    written_last = _generation(tmp_path, "gen-000001")
    stale = _generation(tmp_path, "gen-000002")  # a crashed install, sealed, never swapped
    _generation(tmp_path, "gen-000003", sealed=False)
    old = time.time() - 60
    os.utime(stale / STAMP_FILE, (old, old))
    (tmp_path / CURRENT).symlink_to("gen-000099")  # dangling
    assert linked(tmp_path) is None and current(tmp_path) == written_last


def test_a_copied_current_folder_is_what_readers_see(tmp_path):
    _generation(tmp_path, "gen-000001")
    copy = _generation(tmp_path, CURRENT, sealed=False)
    assert current(tmp_path) == copy


def test_with_nothing_sealed_current_is_the_newest_generation_holding_entries(tmp_path):
    holding = _generation(tmp_path, "gen-000001", sealed=False)
    _generation(tmp_path, "gen-000002", sealed=False, entry=False)
    assert current(tmp_path) == holding


def test_listed_gives_the_sealed_generations_oldest_first_the_current_one_marked(tmp_path):
    _generation(tmp_path, "gen-000001")
    _generation(tmp_path, "gen-000002", sealed=False)  # a crashed install: not listed
    in_use = _generation(tmp_path, "gen-000003")
    _generation(tmp_path, "gen-000004")
    (tmp_path / CURRENT).symlink_to(in_use.name)
    found = [(g.record.id, g.current) for g in listed(tmp_path)]
    assert found == [("gen-000001", False), ("gen-000003", True), ("gen-000004", False)]
    assert listed(tmp_path / "nowhere") == []
