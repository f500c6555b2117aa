import pytest

from registry import RegistryError
from registry.storage.quarantine import QUARANTINE, Quarantine
from registry.storage.write_lock import LOCK_FILE, WriteLock, check_root


def _lock(root, *, timeout=5.0, create=False):
    return WriteLock(root, Quarantine(root), timeout=timeout, create=create)


def test_the_lock_excludes_another_holder_and_says_how_long_it_waited(tmp_path):
    first, second = _lock(tmp_path), _lock(tmp_path, timeout=0.05)
    with first.hold():
        assert first.is_locked and not second.is_locked
        waited = r"write lock not acquired within 0\.05 s"
        with pytest.raises(RegistryError, match=waited), second.hold():
            pass
        shorter = _lock(tmp_path).hold(timeout=0.01)  # a wait of its own, asked for
        with pytest.raises(RegistryError, match=r"within 0\.01 s"), shorter:
            pass
    assert not first.is_locked
    with second.hold():
        assert second.is_locked


def test_a_removed_root_is_made_again_only_when_asked(tmp_path):
    root = tmp_path / "registry"
    with pytest.raises(RegistryError, match="does not exist"), _lock(root).hold():
        pass
    assert not root.exists()
    with _lock(root, create=True).hold():
        assert (root / LOCK_FILE).exists()


def test_check_root_names_the_path_and_how_to_create_a_store(tmp_path):
    check_root(tmp_path)
    with pytest.raises(RegistryError, match=r"'.*nowhere' does not exist.*create=True"):
        check_root(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RegistryError, match="is not a folder"):
        check_root(tmp_path / "file")


def test_a_folder_where_the_lock_file_belongs_is_quarantined_with_its_reason(tmp_path, caplog):
    (tmp_path / LOCK_FILE).mkdir()
    (tmp_path / LOCK_FILE / "inside").write_text("kept")
    lock = _lock(tmp_path)
    with lock.hold():
        assert lock.is_locked and (tmp_path / LOCK_FILE).is_file()
    (moved,) = (p for p in (tmp_path / QUARANTINE).iterdir() if p.is_dir())
    assert (moved / "inside").read_text() == "kept"
    reason = moved.with_name(moved.name + ".reason").read_text()
    assert reason == "a folder where the write lock file belongs"
    assert "a folder where the write lock file belongs" in caplog.text


def test_a_lock_file_is_never_moved_aside_as_a_folder(tmp_path, monkeypatch):
    # another writer moved the folder and holds the real lock file between our check and rename
    lock = _lock(tmp_path)
    lock_file = tmp_path / LOCK_FILE
    lock_file.write_text("")
    monkeypatch.setattr(
        "registry.storage.write_lock.is_real_dir", lambda path: True
    )  # the check, stale
    assert lock.folder_aside(lock_file) is None
    assert lock_file.is_file()
