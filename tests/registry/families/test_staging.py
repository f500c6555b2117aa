"""Staging a bundle's files: moved in after the swap or left nowhere, and a stage that no
live install holds (its install killed -9) removed by the next cleaner, never one in use."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from registry import BundleRejected
from registry.families import staging
from registry.families.staging import STAGE_LOCK, Stage, remove_stale_stages
from tests.registry._workers import started


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


def test_a_stage_in_use_in_this_process_is_never_removed(tmp_path):
    stage = Stage(tmp_path)
    stage.write("b.tgz", "a/one.bin", [b"1"])
    assert stage.root is not None and (stage.root / STAGE_LOCK).is_file()
    old = time.time() - 2 * staging.LOCKLESS_STALE_S  # age is no sign of death
    os.utime(stage.root, (old, old))
    assert remove_stale_stages(tmp_path) == 0
    stage.write("b.tgz", "a/two.bin", [b"2"])  # the install goes on undisturbed
    stage.commit(["a/one.bin", "a/two.bin"])
    stage.discard(failed=False)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["one.bin", "two.bin"]
    assert remove_stale_stages(tmp_path) == 0 and not list(tmp_path.glob(".bundle-*"))


def _holder(folder: Path, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Another process holding a stage in ``folder``, as a live install does."""
    return started("hold_stage", str(folder), ready=tmp_path / "ready")


def test_a_live_installs_stage_stays_and_goes_once_it_is_killed(tmp_path):
    folder = tmp_path / "inductor"
    proc, stage = _holder(folder, tmp_path)
    try:
        assert remove_stale_stages(folder) == 0 and (stage / "a" / "one.bin").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert stage.exists()  # nobody removed it: the kill left it
    assert remove_stale_stages(folder) == 1 and not stage.exists()


def test_a_stage_without_a_lock_goes_once_it_is_old(tmp_path):
    """Its install was killed between making the folder and locking it, or an older
    version made it: only its age tells."""
    stage = tmp_path / ".bundle-old"
    (stage / "a").mkdir(parents=True)
    assert remove_stale_stages(tmp_path) == 0 and stage.exists()
    old = time.time() - 2 * staging.LOCKLESS_STALE_S
    os.utime(stage, (old, old))
    (tmp_path / ".bundle-file").write_bytes(b"not a stage")  # no folder: not ours
    assert remove_stale_stages(tmp_path) == 1 and not stage.exists()
    assert (tmp_path / ".bundle-file").exists()
    assert remove_stale_stages(tmp_path / "missing") == 0


def test_a_fifo_in_place_of_a_stages_lock_never_blocks_the_cleanup(tmp_path):
    """Opening a fifo for reading blocks until a writer comes: every install and the
    sidecar's start would hang on one planted there."""
    stage = tmp_path / ".bundle-planted"
    stage.mkdir()
    os.mkfifo(stage / STAGE_LOCK)
    started = time.monotonic()
    assert remove_stale_stages(tmp_path) == 0 and stage.exists()  # not an install's lock
    assert time.monotonic() - started < 1.0
