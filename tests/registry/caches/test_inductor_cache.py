"""Inductor's artifacts as a registry family: stored by content, restored for the same
key and fingerprint only, corrupt blobs quarantined, nothing escapes the cache folder.
The real compile-and-hit path is ``tests/warmup/compiled/test_warm.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import pytest

from registry.caches import inductor_cache
from registry.core import atomic
from registry.core.errors import RegistryError
from registry.core.fingerprint import cpu_fingerprint

FP = cpu_fingerprint()
KEY = "0123456789abcdef"


def cache(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def save(cache_dir: Path, family: Path, model: str = "mlp", key: str = KEY, fp=FP):
    return inductor_cache.save(
        cache_dir, family, model=model, key_digest=key, key={"k": key}, fingerprint=fp
    )


def restore(family: Path, cache_dir: Path, model: str = "mlp", key: str = KEY, fp=FP):
    return inductor_cache.restore(family, cache_dir, model=model, key_digest=key, fingerprint=fp)


FILES = {
    "fxgraph/ab/fabc/entry": b"graph",
    "aotautograd/aq/entry": b"autograd",
    "ab/cabc.py": b"code",
    "ab/cabc.so": b"\x7fELF kernel",
}


def test_what_is_saved_is_restored_elsewhere_byte_for_byte(tmp_path):
    source = cache(tmp_path / "a", FILES)
    saved = save(source, tmp_path / "family")
    assert (saved.files, saved.new_blobs) == (4, 4)
    done = restore(tmp_path / "family", tmp_path / "b")
    assert (done.copied, done.present, done.quarantined) == (4, 0, 0)
    for rel, data in FILES.items():
        assert (tmp_path / "b" / rel).read_bytes() == data
    again = restore(tmp_path / "family", tmp_path / "b")
    assert (again.copied, again.present) == (0, 4)


def test_models_that_share_files_store_each_once(tmp_path):
    source = cache(tmp_path / "a", FILES)
    save(source, tmp_path / "family", model="first")
    second = save(source, tmp_path / "family", model="second")
    assert (second.files, second.new_blobs) == (4, 0)
    blobs = [p for p in (tmp_path / "family" / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 4


def test_locks_temps_and_links_are_not_stored(tmp_path):
    source = cache(
        tmp_path / "a",
        {
            **FILES,
            "locks/cabc.lock": b"",
            "ab/.1234.5678.tmp": b"half",
            "tmpx1y2/partial": b"half",
        },
    )
    os.symlink("/etc/passwd", source / "ab" / "passwd")
    saved = save(source, tmp_path / "family")
    index = json.loads(inductor_cache.index_path(tmp_path / "family", "mlp", KEY, FP).read_text())
    assert sorted(index["files"]) == sorted(FILES) and saved.files == 4


def test_a_corrupt_blob_is_quarantined_and_only_its_file_is_missing(tmp_path):
    source = cache(tmp_path / "a", FILES)
    save(source, tmp_path / "family")
    blobs = (tmp_path / "family" / "blobs").rglob("*")
    blob = next(p for p in blobs if p.is_file() and p.read_bytes() == b"code")
    blob.write_bytes(b"rotten")
    done = restore(tmp_path / "family", tmp_path / "b")
    assert (done.copied, done.quarantined) == (3, 1)
    assert not (tmp_path / "b" / "ab" / "cabc.py").exists()  # recompiled, not loaded
    assert not blob.exists() and list((tmp_path / "family" / "quarantine").iterdir())
    saved = save(source, tmp_path / "family")  # the next save puts it back
    assert saved.new_blobs == 1 and restore(tmp_path / "family", tmp_path / "c").copied == 4


def test_another_fingerprint_is_never_restored_and_the_factor_is_named(tmp_path):
    save(cache(tmp_path / "a", FILES), tmp_path / "family")
    other = dataclasses.replace(FP, software=dataclasses.replace(FP.software, torch="9.9.9"))
    done = restore(tmp_path / "family", tmp_path / "b", fp=other)
    assert done.index is None and not (tmp_path / "b").exists()
    assert done.why_not == f"stored for software.torch={FP.software.torch}, this host has 9.9.9"


@pytest.mark.parametrize(
    "model,key,why",
    [
        ("other", KEY, "no artifacts of model other are stored"),
        ("mlp", "fedcba9876543210", "the stored artifacts of model mlp are for other code"),
    ],
)
def test_a_miss_says_why(tmp_path, model, key, why):
    save(cache(tmp_path / "a", FILES), tmp_path / "family")
    assert restore(tmp_path / "family", tmp_path / "b", model=model, key=key).why_not.startswith(
        why
    )


@pytest.mark.parametrize(
    "rel", ["../escape", "/etc/passwd", "a/../../b", "locks/x", "a/.tmp", "fx/a\x00b", "a\nb"]
)
def test_an_index_naming_a_path_outside_the_cache_is_quarantined(tmp_path, rel):
    save(cache(tmp_path / "a", FILES), tmp_path / "family")
    path = inductor_cache.index_path(tmp_path / "family", "mlp", KEY, FP)
    index = json.loads(path.read_text())
    index["files"][rel] = next(iter(index["files"].values()))
    path.write_text(json.dumps(index))
    done = restore(tmp_path / "family", tmp_path / "b")
    assert done.index is None and "quarantined" in done.why_not
    assert not path.exists() and not (tmp_path / "escape").exists()


def test_names_that_would_leave_the_family_folder_are_refused(tmp_path):
    with pytest.raises(RegistryError):
        save(cache(tmp_path / "a", FILES), tmp_path / "family", model="../x")
    with pytest.raises(RegistryError):
        save(tmp_path / "a", tmp_path / "family", key="../../x")


def test_files_past_the_size_limit_are_skipped_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(inductor_cache, "MAX_FILE_BYTES", 8)
    saved = save(cache(tmp_path / "a", FILES), tmp_path / "family")
    assert saved.files == 3 and saved.skipped == ["ab/cabc.so: 11 bytes, past the family's limits"]


def test_triton_groups_in_inductors_triton_folder_point_at_the_new_place(tmp_path):
    origin = tmp_path / "a"
    group = {"child_paths": {"k.cubin": str(origin / "triton" / "0" / "H" / "k.cubin")}}
    source = cache(
        origin,
        {"triton/0/H/k.cubin": b"cubin", "triton/0/H/__grp__k.json": json.dumps(group).encode()},
    )
    save(source, tmp_path / "family")
    done = restore(tmp_path / "family", tmp_path / "b")
    assert done.relocated == 1
    moved = json.loads((tmp_path / "b" / "triton/0/H/__grp__k.json").read_text())
    assert moved["child_paths"]["k.cubin"] == str(tmp_path / "b" / "triton" / "0" / "H" / "k.cubin")


def test_a_folder_where_a_blob_should_be_is_quarantined_too(tmp_path):
    source = cache(tmp_path / "a", FILES)
    save(source, tmp_path / "family")
    blobs = (tmp_path / "family" / "blobs").rglob("*")
    blob = next(p for p in blobs if p.is_file() and p.read_bytes() == b"graph")
    blob.unlink()
    blob.mkdir()
    done = restore(tmp_path / "family", tmp_path / "b")
    assert (done.copied, done.quarantined) == (3, 1) and not blob.exists()


def _grows_once_opened(monkeypatch, path: Path, by: int) -> None:
    """``path`` grows by ``by`` bytes right after the family's reader has checked it."""
    real = atomic.open_bounded

    @contextlib.contextmanager
    def opened(src, limit, **kwargs):
        with real(src, limit, **kwargs) as f:
            if Path(src) == path:
                with open(path, "ab") as more:
                    more.write(b"g" * by)
            yield f

    monkeypatch.setattr(atomic, "open_bounded", opened)


def _index(family: Path) -> dict:
    (path,) = inductor_cache.index_files(family / "models")
    return json.loads(path.read_text())


def test_a_file_that_grows_past_the_limit_while_saved_is_skipped_the_others_kept(
    tmp_path, monkeypatch, caplog
):
    source = cache(tmp_path / "a", FILES)
    monkeypatch.setattr(inductor_cache, "MAX_FILE_BYTES", 2**20)
    _grows_once_opened(monkeypatch, source / "ab/cabc.py", 4 * 2**20)
    saved = save(source, tmp_path / "family")
    assert saved.files == 3 and len(saved.skipped) == 1 and "ab/cabc.py" in saved.skipped[0]
    assert "not stored" in caplog.text
    files = _index(tmp_path / "family")["files"]
    assert "ab/cabc.py" not in files
    for sha, size in files.values():  # each size the index gives is the blob's
        assert inductor_cache.blob_path(tmp_path / "family", sha).stat().st_size == size
    blobs = [p for p in (tmp_path / "family" / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 3 and all(p.stat().st_size < 2**20 for p in blobs)


def test_a_file_that_grows_within_the_limit_is_stored_with_the_size_stored(tmp_path, monkeypatch):
    source = cache(tmp_path / "a", {"ab/cabc.py": b"0123456789"})
    _grows_once_opened(monkeypatch, source / "ab/cabc.py", 1000)
    save(source, tmp_path / "family")
    sha, size = _index(tmp_path / "family")["files"]["ab/cabc.py"]
    assert size == 1010 == inductor_cache.blob_path(tmp_path / "family", sha).stat().st_size


def test_a_restore_writes_no_more_than_its_index_declares(tmp_path):
    save(cache(tmp_path / "a", FILES), tmp_path / "family")
    (path,) = inductor_cache.index_files(tmp_path / "family" / "models")
    index = json.loads(path.read_text())
    index["files"]["ab/cabc.py"][1] = 2  # the blob holds 4 bytes, whose hash is its name
    path.write_text(json.dumps(index))
    done = restore(tmp_path / "family", tmp_path / "b")
    assert (done.copied, done.missing, done.quarantined) == (3, 1, 0)
    assert not (tmp_path / "b" / "ab/cabc.py").exists()


def test_an_index_that_restores_more_than_a_model_may_is_refused(tmp_path):
    save(cache(tmp_path / "a", FILES), tmp_path / "family")
    (path,) = inductor_cache.index_files(tmp_path / "family" / "models")
    index = json.loads(path.read_text())
    sha = index["files"]["ab/cabc.py"][0]
    count = inductor_cache.MAX_MODEL_BYTES // inductor_cache.MAX_FILE_BYTES + 1
    for i in range(count):  # one blob under many paths: each path is a file written
        index["files"][f"copies/{i}"] = [sha, inductor_cache.MAX_FILE_BYTES]
    path.write_text(json.dumps(index))
    with pytest.raises(RegistryError, match=f"limit {inductor_cache.MAX_MODEL_BYTES}"):
        inductor_cache.read_index(path)
    done = restore(tmp_path / "family", tmp_path / "b")
    assert done.index is None and "quarantined" in done.why_not and done.copied == 0
    assert not (tmp_path / "b").exists()


def test_a_link_at_a_restore_destination_is_replaced_not_followed(tmp_path):
    save(cache(tmp_path / "a", FILES), tmp_path / "family")
    outside = tmp_path / "outside.py"
    outside.write_bytes(b"code")  # the same size and bytes as the file it stands for
    target = tmp_path / "b"
    (target / "ab").mkdir(parents=True)
    os.symlink(outside, target / "ab" / "cabc.py")
    done = restore(tmp_path / "family", target)
    assert done.copied == 4 and not (target / "ab" / "cabc.py").is_symlink()
    assert (target / "ab" / "cabc.py").read_bytes() == b"code" and outside.read_bytes() == b"code"
