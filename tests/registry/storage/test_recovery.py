import os

from registry import Store
from registry.storage.entry_writer import EntryWriter
from registry.storage.generation_writer import GenerationWriter
from registry.storage.generations import CURRENT, GENERATION_FILE, linked
from registry.storage.quarantine import QUARANTINE, Quarantine
from registry.storage.recovery import Recovery, temp_files
from registry.storage.write_lock import WriteLock


def _recovery(root, *, budget_s=60.0):
    quarantine = Quarantine(root)
    lock = WriteLock(root, quarantine, timeout=5.0, create=False)
    generations = GenerationWriter(root, EntryWriter(root, quarantine), quarantine, keep=8)
    return Recovery(root, lock, generations, budget_s=budget_s)


def _store(root, make_entry):
    Store(root).put_many([make_entry(m=m) for m in range(1, 4)])
    return root / os.readlink(root / CURRENT)


def test_temp_files_are_found_anywhere_but_in_quarantine_with_a_mark_per_folder(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / ".tmp-1-x.json").write_text("{")
    (tmp_path / "a" / "b" / ".tmp-2-y.json").write_text("{")
    (tmp_path / ".tmp-3-dir" / "inside").mkdir(parents=True)  # one, not walked into
    (tmp_path / ".tmp-3-dir" / "inside" / ".tmp-4-z").write_text("")
    (tmp_path / QUARANTINE / "gen-000001").mkdir(parents=True)
    (tmp_path / QUARANTINE / "gen-000001" / ".tmp-5-kept").write_text("")
    found = list(temp_files(tmp_path))
    paths = sorted(p.relative_to(tmp_path).as_posix() for p in found if p is not None)
    assert paths == [".tmp-3-dir", "a/.tmp-1-x.json", "a/b/.tmp-2-y.json"]
    assert found.count(None) == 4  # root, a, a/b, quarantine


def test_recover_clears_temp_files_crashed_installs_and_a_broken_current(tmp_path, make_entry):
    gen = _store(tmp_path, make_entry)
    (gen / "ag_gemm" / ".tmp-abc-x.json").write_text("{")
    recovery = _recovery(tmp_path)
    crashed = recovery.generations.fork(gen)
    (tmp_path / CURRENT).unlink()
    report = recovery.recover()
    assert report == {
        "repaired": f"pointed 'current' at {gen.name}",
        "temp_files": [f"{gen.name}/ag_gemm/.tmp-abc-x.json"],
        "generations": {"removed": [crashed.name], "quarantined": []},
    }
    assert linked(tmp_path) == gen and not crashed.exists() and recovery.cleared
    assert recovery.recovered == {"temp_files": 1, "generations_removed": 1, "repairs": 1}
    assert recovery.recover() == {
        "repaired": "",
        "temp_files": [],
        "generations": {"removed": [], "quarantined": []},
    }
    assert recovery.recovered == {"temp_files": 1, "generations_removed": 1, "repairs": 1}


def test_recover_within_a_budget_leaves_the_rest_to_the_next_write(
    tmp_path, make_entry, monkeypatch
):
    gen = _store(tmp_path, make_entry)
    for i in range(3):
        (gen / "ag_gemm" / f".tmp-{i}-x.json").write_text("{")
    walks = []
    monkeypatch.setattr(
        "registry.storage.recovery.temp_files", lambda root: walks.append(root) or temp_files(root)
    )
    recovery = _recovery(tmp_path, budget_s=60.0)
    report = recovery.recover(budget_s=0.0)
    assert report["unfinished"] and len(report["temp_files"]) < 3 and not recovery.cleared
    with recovery.lock.hold():
        recovery.clear_debris()
    assert not list(gen.glob("ag_gemm/.tmp-*")) and recovery.cleared
    assert walks == [tmp_path]  # the write went on with recover's walk, not a new one
    assert recovery.recovered["temp_files"] == 3


def test_a_writes_share_stops_at_its_budget_and_says_the_rest_comes_later(
    tmp_path, make_entry, caplog
):
    gen = _store(tmp_path, make_entry)
    for i in range(3):
        (gen / "ag_gemm" / f".tmp-{i}-x.json").write_text("{")
    recovery = _recovery(tmp_path, budget_s=0.0)  # one file or folder per write
    rounds = 0
    while not recovery.cleared:
        with recovery.lock.hold():
            recovery.clear_debris()
        rounds += 1
        assert rounds < 20
    assert rounds > 3 and not list(gen.glob("ag_gemm/.tmp-*"))
    lines = [r.getMessage() for r in caplog.records if "killed writers left" in r.getMessage()]
    assert len(lines) == 3 and all("the rest at the next write" in line for line in lines)
    assert recovery.recovered == {"temp_files": 3}  # the walk went on: nothing counted twice


def test_a_writes_share_reseals_a_generation_that_lost_its_record(tmp_path, make_entry, caplog):
    gen = _store(tmp_path, make_entry)
    (gen / GENERATION_FILE).unlink()
    recovery = _recovery(tmp_path)
    with recovery.lock.hold():
        recovery.clear_debris()
    assert recovery.cleared and recovery.recovered == {"repairs": 1}
    assert f"repaired: resealed {gen.name}" in caplog.text
