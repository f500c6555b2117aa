import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from registry.caches import triton_cache
from registry.core import atomic
from tests.conftest import env_without_interpreter, last_json, run_python

pytestmark = pytest.mark.slow


def compile_in(cache_dir: Path) -> dict:
    env = env_without_interpreter(TRITON_CACHE_DIR=str(cache_dir))
    done = run_python("-m", "tests.registry._compile_sm90", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return last_json(done.stdout)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A real sm90 compile cache, made once for the module."""
    origin = tmp_path_factory.mktemp("origin")
    first = compile_in(origin)
    assert not first["hit"] and first["cubin"] > 0
    return origin, first


def test_restored_cache_hits_in_another_folder(compiled, tmp_path):
    origin, first = compiled
    volume = tmp_path / "volume" / "triton-cache"
    saved = triton_cache.save(origin, volume)
    assert saved.copied >= 3  # cubin, metadata json, group file at least
    restored_dir = tmp_path / "elsewhere" / "cache"
    sync = triton_cache.restore(volume, restored_dir)
    assert sync.copied == saved.copied and sync.relocated == 1
    second = compile_in(restored_dir)
    assert second["hit"], f"Triton recompiled: wrote {second['written']}"
    assert second["in_cache"] and second["hash"] == first["hash"]


def test_a_plain_copy_misses_which_is_why_restore_relocates(compiled, tmp_path):
    origin, _ = compiled
    first_pod = tmp_path / "first-pod"  # the folder the group files name, gone in a new pod
    shutil.copytree(origin, first_pod)
    triton_cache.relocate(first_pod)
    copied = tmp_path / "plain-copy"
    shutil.copytree(first_pod, copied)
    shutil.rmtree(first_pod)
    assert not compile_in(copied)["hit"]


def test_save_and_restore_are_incremental_and_skip_temp_files(compiled, tmp_path):
    origin, _ = compiled
    work = tmp_path / "work"
    shutil.copytree(origin, work)
    (next(work.iterdir()) / "tmp.pid_1_x").mkdir()
    (next(work.iterdir()) / "lock").write_text("")
    volume = tmp_path / "vol"
    first = triton_cache.save(work, volume)
    again = triton_cache.save(work, volume)
    assert again.copied == 0 and again.present == first.copied
    names = {p.name for p in volume.rglob("*")}
    assert "lock" not in names and not any(n.startswith("tmp.") for n in names)
    target = tmp_path / "target"
    triton_cache.restore(volume, target)
    assert triton_cache.restore(volume, target).copied == 0


def test_restore_from_a_missing_folder_is_a_no_op(tmp_path):
    assert triton_cache.restore(tmp_path / "none", tmp_path / "cache").copied == 0


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"child_paths": ["a"]}',  # once: AttributeError out of relocate, a failed restore
        '{"child_paths": {"a": 5}}',
        '{"child_paths": {"a": "/x/a"}, "deep": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "[1]",
    ],
)
def test_unreadable_group_file_is_skipped(tmp_path, content):
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "__grp__k.json").write_text(content)
    assert triton_cache.relocate(tmp_path) == 0


def test_save_removes_temp_files_a_killed_copy_left(tmp_path):
    target = tmp_path / "volume"
    (target / "abc").mkdir(parents=True)
    stale, fresh = target / "abc" / ".tmp-1-x.cubin", target / "abc" / ".tmp-2-y.cubin"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"in progress")
    old = time.time() - 2 * triton_cache.STALE_TEMP_S
    os.utime(stale, (old, old))
    triton_cache.save(tmp_path / "empty", target)
    assert not stale.exists() and fresh.exists()


def test_a_staging_folder_is_left_to_its_own_lock_however_old(tmp_path):
    """Stages hold a lock while their install lives (registry.families.staging, which
    removes them): an old one may be a slow install still running."""
    stage = tmp_path / ".bundle-abc"
    (stage / "hash").mkdir(parents=True)
    (stage / "hash" / "kernel.cubin").write_bytes(b"x")
    old = time.time() - 2 * triton_cache.STALE_TEMP_S
    os.utime(stage, (old, old))
    assert triton_cache.remove_stale_temp_files(tmp_path) == 0
    assert (stage / "hash" / "kernel.cubin").exists()


def _group(folder: Path, children: dict, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "__grp__k.json"
    path.write_text(json.dumps({"child_paths": children, **extra}))
    return path


def test_a_group_file_over_its_limit_is_skipped_unread(tmp_path, caplog):
    pad = "a" * 2**20  # Triton's group files are a few hundred bytes
    group = _group(tmp_path / "abc", {"k.cubin": "/x/k.cubin"}, pad=pad)
    before = group.read_bytes()
    assert triton_cache.relocate(tmp_path) == 0 and group.read_bytes() == before
    assert f"limit {2**20}" in caplog.text


def test_relocate_rewrites_only_the_groups_it_is_given(tmp_path):
    mine = _group(tmp_path / "mine", {"k.cubin": "/x/k.cubin"})
    other = _group(tmp_path / "other", {"k.cubin": "/x/k.cubin"})
    before = other.read_bytes()
    assert triton_cache.relocate(tmp_path, groups=[mine]) == 1
    assert json.loads(mine.read_text())["child_paths"] == {"k.cubin": str(mine.parent / "k.cubin")}
    assert other.read_bytes() == before


def test_a_child_path_that_names_a_folder_is_dropped(tmp_path):
    children = {"k.cubin": "/x/k.cubin", "up": "/x/..", "root": "/", "empty": "", "dot": "."}
    group = _group(tmp_path / "abc", children)
    assert triton_cache.relocate(tmp_path) == 1
    moved = json.loads(group.read_text())["child_paths"]
    assert moved == {"k.cubin": str(tmp_path / "abc" / "k.cubin")}


def test_restore_writes_many_files_whole_without_fsync_and_save_keeps_them(tmp_path, monkeypatch):
    source = tmp_path / "volume"
    for g in range(20):
        folder = source / f"{g:052x}"
        folder.mkdir(parents=True)
        (folder / "k.cubin").write_bytes(bytes([g]) * (100 + g))
        (folder / "k.json").write_text(json.dumps({"g": g}))
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    sync = triton_cache.restore(source, tmp_path / "cache")
    assert (sync.copied, len(sync.folders), synced) == (40, 20, [])  # a pod's scratch
    for g in range(20):
        assert (tmp_path / "cache" / f"{g:052x}" / "k.cubin").read_bytes() == bytes([g]) * (100 + g)
    assert not list((tmp_path / "cache").glob("*/.tmp-*"))
    assert triton_cache.restore(source, tmp_path / "cache").present == 40
    triton_cache.save(tmp_path / "cache", tmp_path / "other")
    assert synced  # the volume's copies are durable


def test_a_file_over_the_limit_or_growing_past_it_is_skipped_the_others_copied(
    tmp_path, monkeypatch, caplog
):
    work = tmp_path / "work" / "HASH"
    work.mkdir(parents=True)
    (work / "k.cubin").write_bytes(b"\x7fELF" + b"k" * 100)
    (work / "big.ptx").write_bytes(b"p" * 5000)
    (work / "grows.ttir").write_bytes(b"t" * 10)
    monkeypatch.setattr(triton_cache, "MAX_FILE_BYTES", 4096)
    real = atomic.open_bounded

    @contextlib.contextmanager
    def opened(src, limit, **kwargs):
        with real(src, limit, **kwargs) as f:
            if src.name == "grows.ttir":  # grows after its size was checked
                with open(src, "ab") as more:
                    more.write(b"t" * 10_000)
            yield f

    monkeypatch.setattr(atomic, "open_bounded", opened)
    saved = triton_cache.save(tmp_path / "work", tmp_path / "volume")
    assert saved.copied == 1 and len(saved.skipped) == 2
    assert sorted(p.name for p in (tmp_path / "volume" / "HASH").iterdir()) == ["k.cubin"]
    assert "big.ptx" in caplog.text and "grows.ttir" in caplog.text
    (tmp_path / "volume" / "HASH" / "big.ptx").write_bytes(b"p" * 5000)
    restored = triton_cache.restore(tmp_path / "volume", tmp_path / "cache")
    assert restored.copied == 1 and "big.ptx" in restored.skipped[0]
    assert sorted(p.name for p in (tmp_path / "cache" / "HASH").iterdir()) == ["k.cubin"]
