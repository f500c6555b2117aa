"""Declared folders: saved once per name, key and host, restored at any path for the
same key and host only; a damaged blob costs its file, never the rest."""

from __future__ import annotations

import dataclasses
import shutil

from registry.families import Sources, named
from registry.families.base import Declared, Host
from registry.families.declared import FOLDER
from registry.triton_cache import Origin
from tests.registry.families.conftest import FP, make_scope, read, write

FAMILY = named("declared-folders")


def host(fp=FP) -> Host:
    return Host(fp, Origin.of(fp, {}))


def test_a_folder_saved_is_restored_at_another_path(tmp_path, engine):
    files = read(engine.folder)
    saved = FAMILY.save(make_scope(tmp_path, folders=[engine]))
    assert (saved.copied, saved.notes) == (2, [])
    assert (tmp_path / "volume" / FOLDER / "blobs").is_dir()
    elsewhere = dataclasses.replace(engine, folder=tmp_path / "other" / "cache")
    restored = FAMILY.restore(make_scope(tmp_path, folders=[elsewhere]))
    assert (restored.copied, restored.notes) == (2, [])
    assert read(elsewhere.folder) == files


def test_another_key_or_host_is_a_miss_that_says_why(tmp_path, engine):
    FAMILY.save(make_scope(tmp_path, folders=[engine]))
    shutil.rmtree(engine.folder)
    other_key = dataclasses.replace(engine, key_digest="b" * 32)
    moved = FAMILY.restore(make_scope(tmp_path, folders=[other_key]))
    assert moved.copied == 0 and "other code or shapes" in moved.notes[0]
    torch9 = dataclasses.replace(FP, software=dataclasses.replace(FP.software, torch="9.0"))
    moved = FAMILY.restore(make_scope(tmp_path, folders=[engine], fingerprint=torch9))
    assert moved.copied == 0 and "torch" in moved.notes[0]
    assert not engine.folder.exists()


def test_nothing_moves_before_the_host_is_known(tmp_path, engine):
    scope = make_scope(tmp_path, folders=[engine], fingerprint=None)
    assert not FAMILY.save(scope).anything
    assert not (tmp_path / "volume" / FOLDER).exists()
    assert FAMILY.needs_host


def test_a_damaged_blob_costs_its_file_only(tmp_path, engine):
    FAMILY.save(make_scope(tmp_path, folders=[engine]))
    blobs = sorted((tmp_path / "volume" / FOLDER / "blobs").rglob("*"))
    damaged = next(p for p in blobs if p.is_file() and p.read_bytes() == b"graph")
    damaged.write_bytes(b"grapH")
    shutil.rmtree(engine.folder)
    one = FAMILY.restore_one(make_scope(tmp_path, folders=[engine]), engine)
    assert one.outcome == "hit (1 artifacts to be written again by the server)"
    assert read(engine.folder) == {"config.json": b"{}"}


def test_the_run_saves_only_what_is_not_stored_yet(tmp_path, engine):
    scope = make_scope(tmp_path, folders=[engine])
    assert FAMILY.save(scope).copied == 2
    write(engine.folder, {"new.bin": b"new"})
    assert not FAMILY.save(scope).anything  # the harvest keeps what traffic adds


def test_explain_names_hit_miss_and_nothing_declared(tmp_path, engine):
    scope = make_scope(tmp_path, folders=[engine])
    assert FAMILY.explain(scope, host(), Sources()).outcome == "miss"
    FAMILY.save(scope)
    assert FAMILY.explain(scope, host(), Sources()).outcome == "hit"
    cuda13 = dataclasses.replace(FP, software=dataclasses.replace(FP.software, cuda_runtime="13.0"))
    got = FAMILY.explain(scope, host(cuda13), Sources())
    assert (got.outcome, got.factor, got.mine) == ("miss", "CUDA", "13.0")
    empty = FAMILY.explain(make_scope(tmp_path), host(), Sources())
    assert (empty.outcome, empty.note) == ("empty", "no caches declared")


def test_an_item_without_a_key_is_said_and_skipped(tmp_path):
    broken = Declared("vllm", "", error="it has no key: unreadable")
    scope = make_scope(tmp_path, folders=[broken])
    assert FAMILY.restore_one(scope, broken).outcome == "miss: it has no key: unreadable"
    assert FAMILY.explain(scope, host(), Sources()).note == "vllm: it has no key: unreadable"
