import errno
import os
import time
from pathlib import Path

from registry.core import atomic
from registry.storage.garbage import GarbageCollector
from registry.storage.generations import CURRENT, entry_paths, generation_dirs, linked
from registry.storage.quarantine import QUARANTINE
from tests.registry.storage.test_generation_writer import _generations, _put, _rel


def _collector(gens):
    """A collector of ``gens``'s store, as its writer's own is made."""
    return GarbageCollector(gens.root, gens.quarantine, keep=gens.keep)


def test_only_generations_no_one_needs_are_removed(tmp_path, make_entry):
    gens = _generations(tmp_path, keep=2)
    collector = _collector(gens)
    first = _put(gens, make_entry(m=1))
    gens.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    (linked(tmp_path) / make_entry(m=1).relpath()).unlink()  # lost from current by hand
    for i in range(3):
        gens.install([make_entry(m=10 + i)], record={"bundle": {"name": f"c{i}"}})
    seen = list(collector.garbage())
    assert seen == [("kept", first.name), ("removed", "gen-000002"), ("removed", "gen-000003")]
    assert [g.name for g in generation_dirs(tmp_path)] == [first.name, "gen-000004", "gen-000005"]


def test_without_a_current_link_nothing_is_collected(tmp_path, make_entry):
    gens = _generations(tmp_path, keep=2)
    for i in range(4):
        gens.install([make_entry(m=i)], record={"bundle": {"name": f"c{i}"}})
    (tmp_path / CURRENT).unlink()  # a repair decides first which one is current
    assert _collector(gens).collect() == {"removed": [], "quarantined": []}
    assert len(generation_dirs(tmp_path)) == 5


def test_an_unsealed_generation_with_entries_of_its_own_goes_to_quarantine(tmp_path, make_entry):
    gens = _generations(tmp_path)
    collector = _collector(gens)
    current = _put(gens, make_entry(m=1))
    crashed = gens.fork(current)  # an install killed before its seal: links only
    unique = gens.fork(current)
    gens.writer.merge_into(unique, make_entry(m=99))
    assert collector.collect() == {"removed": [crashed.name], "quarantined": [unique.name]}
    (kept,) = (tmp_path / QUARANTINE).glob(f"*{unique.name}-never-current")
    assert entry_paths(kept) == {_rel(make_entry(m=1)), _rel(make_entry(m=99))}


def test_garbage_collection_past_its_deadline_goes_on_where_it_stopped(tmp_path, make_entry):
    gens = _generations(tmp_path, keep=2)
    collector = _collector(gens)
    kept = _put(gens, make_entry(m=1))
    gens.install([make_entry(m=2)], record={"bundle": {"name": "a"}})
    (linked(tmp_path) / make_entry(m=1).relpath()).unlink()  # the first alone holds M=1
    for i in range(2):
        gens.install([make_entry(m=3 + i)], record={"bundle": {"name": f"b{i}"}})
    crashed = [gens.fork(linked(tmp_path)) for _ in range(3)]
    seen = []
    for _ in range(5):  # one generation per call: the one it keeps first, then one removed each
        done, finished = collector.collect_until(time.monotonic())
        seen += done["removed"]
        assert not finished
    assert kept.is_dir() and seen == ["gen-000002", *(g.name for g in crashed)]
    assert collector.collect_until(time.monotonic() + 60) == (
        {"removed": [], "quarantined": []},
        True,
    )


def test_a_kept_generation_whose_record_cannot_be_read_now_is_not_collected(
    tmp_path, make_entry, monkeypatch
):
    gens = _generations(tmp_path)
    collector = _collector(gens)
    parent = _put(gens, make_entry(m=1))
    gens.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    assert os.readlink(tmp_path / CURRENT) != parent.name
    real = atomic.read_bounded

    def eio(path, limit):
        if Path(path).parent == parent:
            raise OSError(errno.EIO, "Input/output error")
        return real(path, limit)

    monkeypatch.setattr(atomic, "read_bounded", eio)
    assert collector.collect() == {"removed": [], "quarantined": []}
    assert parent.is_dir()
