from registry.storage.quarantine import QUARANTINE, Quarantine


def test_names_are_fresh_and_end_with_what_was_moved(tmp_path):
    quarantine = Quarantine(tmp_path)
    names = {quarantine.path("gen-000001-x.json") for _ in range(200)}
    assert len(names) == 200  # never overwritten, even within one second
    assert all(p.parent == tmp_path / QUARANTINE for p in names)
    assert all(p.name.endswith("-gen-000001-x.json") for p in names)


def test_a_file_and_a_folder_are_moved_with_their_reason_and_only_set_aside_counts(tmp_path):
    quarantine = Quarantine(tmp_path)
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "inside").write_text("kept")
    folder = quarantine.path("stray")
    quarantine.move_aside(tmp_path / "stray", folder, "in the way of an entry")
    assert (folder / "inside").read_text() == "kept" and not (tmp_path / "stray").exists()
    assert folder.with_name(folder.name + ".reason").read_text() == "in the way of an entry"
    assert quarantine.moved == 0  # in the way is not corrupt: not counted
    (tmp_path / "bad.json").write_text("{")
    target = quarantine.path("bad.json")
    quarantine.set_aside(tmp_path / "bad.json", target, "not JSON")
    assert target.read_text() == "{" and quarantine.moved == 1
    assert quarantine.count() == 2


def test_a_file_where_the_folder_belongs_is_renamed_aside_and_kept(tmp_path):
    (tmp_path / QUARANTINE).write_text("someone's file")
    quarantine = Quarantine(tmp_path)
    (tmp_path / "bad.json").write_text("{")
    quarantine.set_aside(tmp_path / "bad.json", quarantine.path("bad.json"), "not JSON")
    assert (tmp_path / QUARANTINE).is_dir() and quarantine.count() == 1
    (kept,) = tmp_path.glob(f"{QUARANTINE}.*")
    assert kept.read_text() == "someone's file"


def test_the_count_sees_what_any_process_moved_and_no_folder_counts_zero(tmp_path):
    assert Quarantine(tmp_path).count() == 0
    mover = Quarantine(tmp_path)
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text("{")
        mover.set_aside(tmp_path / name, mover.path(name), "not JSON")
    other = Quarantine(tmp_path)
    assert other.count() == 2 and other.moved == 0
