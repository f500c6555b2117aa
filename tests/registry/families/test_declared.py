"""Declared folders: saved once per name, key and host, restored at any path for the
same key and host only; a damaged blob costs its file, never the rest."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import pytest

from registry import BundleRejected, Store
from registry.bundles import bundle
from registry.caches.triton_cache import Origin
from registry.families import Sources, named
from registry.families.base import Declared, Host
from registry.families.declared import FOLDER
from registry.families.engine_key import FIX, RECORD, EngineKey, EngineKeySpec
from registry.remote.tier import RemoteTier
from registry.trust import signing
from registry.trust.signing import SigningKey, Trust
from tests._trust import UNSIGNED_OK
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
    assert moved.copied == 0
    assert "the stored artifacts of declared folder vllm are for another key" in moved.notes[0]
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


def test_a_folder_travels_by_signed_bundle_and_rolls_back(tmp_path, engine):
    private, _ = signing.generate(tmp_path / "trusted", "fleet")
    key, trust = SigningKey.load(private), Trust.load(tmp_path / "trusted")
    files = read(engine.folder)
    FAMILY.save(make_scope(tmp_path / "a", folders=[engine]))
    out = tmp_path / "caches.tgz"
    bundle.create(
        out, name="c", version="1", entries=[], roots=bundle.on_volume(tmp_path / "a" / "volume"),
        signer=key,
    )  # fmt: skip
    verified = bundle.verify(out, trust=trust)
    assert len(verified.parts["declared-folders"].indexes) == 1
    assert bundle.describe(verified.manifest["members"]).endswith(
        "1 declared folder indexes (2 files)"
    )
    target = tmp_path / "b" / "volume"
    store = Store(target / "registry", create=True)
    with pytest.raises(BundleRejected, match="no caches folder was given"):
        bundle.install(out, store, expect=None, trust=trust)
    info = bundle.install(out, store, expect=None, trust=trust, roots=bundle.on_volume(target))
    assert info["caches"] == 1 and info["caches_indexes"]
    shutil.rmtree(engine.folder)
    assert FAMILY.restore(make_scope(tmp_path / "b", folders=[engine])).copied == 2
    assert read(engine.folder) == files
    bundle.rollback(store, roots=bundle.on_volume(target))  # the index it brought goes
    assert not FAMILY.stored(make_scope(tmp_path / "b", folders=[engine]), engine)


def test_an_unsigned_bundle_of_folders_is_refused_where_keys_are_trusted(tmp_path, engine):
    signing.generate(tmp_path / "trusted", "fleet")
    FAMILY.save(make_scope(tmp_path / "a", folders=[engine]))
    out = tmp_path / "caches.tgz"
    roots = bundle.on_volume(tmp_path / "a" / "volume")
    bundle.create(out, name="c", version="1", entries=[], roots=roots)
    with pytest.raises(BundleRejected, match="unsigned"):
        bundle.verify(out, trust=Trust.load(tmp_path / "trusted"))


def test_a_pod_without_the_volume_fetches_a_folder_from_the_remote_tier(tmp_path, engine, server):
    files = read(engine.folder)
    tier = RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)
    FAMILY.save(make_scope(tmp_path / "a", folders=[engine], remote=tier))
    assert server.client.keys("triton-warmup:caches:vllm:*")
    assert not server.client.keys("triton-warmup:model:*")  # its own namespace
    shutil.rmtree(engine.folder)
    b = make_scope(
        tmp_path / "b",
        folders=[engine],
        remote=RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK),
    )
    assert FAMILY.explain(b, host(), Sources(remote=b.remote)).outcome == "hit"
    assert FAMILY.restore(b).copied == 2
    assert read(engine.folder) == files
    assert FAMILY.stored(b, engine)  # kept on b's volume for the pods after it


def test_an_empty_folder_is_never_stored(tmp_path, engine):
    empty = dataclasses.replace(engine, folder=tmp_path / "empty")
    empty.folder.mkdir()
    scope = make_scope(tmp_path, folders=[empty])
    assert not FAMILY.save(scope).anything and not FAMILY.stored(scope, empty)
    write(empty.folder, {"late.bin": b"written by the server later"})
    assert FAMILY.save(scope).copied == 1  # the next run's end stores it


def test_a_harvest_never_replaces_what_is_stored_with_less(tmp_path, engine):
    scope = make_scope(tmp_path, folders=[engine])
    FAMILY.save(scope)
    files = read(engine.folder)
    (engine.folder / "config.json").unlink()  # a folder this container only partly sees
    assert not FAMILY.harvest(scope).anything
    shutil.rmtree(engine.folder)
    FAMILY.restore(scope)
    assert read(engine.folder) == files
    write(engine.folder, {"traffic.bin": b"compiled under traffic"})
    assert FAMILY.harvest(scope).copied == 1  # more than stored: kept


def with_engine(item: Declared, env: dict[str, str], engine: str = "vllm", **changes) -> Declared:
    """``item`` as the scope declares it in a pod with environment ``env``."""
    folder = changes.pop("folder", item.folder)
    facts = EngineKey.here(EngineKeySpec.of(engine, **changes), folder, env)
    key = {**item.key, RECORD: facts.to_json()}
    return dataclasses.replace(item, key=key, folder=folder)


def test_a_folder_explained_under_another_engine_variable_names_it(tmp_path, engine):
    FAMILY.save(make_scope(tmp_path, folders=[with_engine(engine, {"VLLM_X": "a"})]))
    here = with_engine(engine, {"VLLM_X": "b"})
    got = FAMILY.explain(make_scope(tmp_path, folders=[here]), host(), Sources())
    assert (got.outcome, got.factor, got.mine, got.stored) == ("miss", "env VLLM_X", "b", "a")
    assert got.note.startswith(
        "vllm: restored, but the engine will miss: VLLM_X is 'b' here, 'a' where it was "
        "written; hold them equal across the fleet"
    )


def test_a_folder_restored_under_another_variable_is_restored_and_says_why(
    tmp_path, engine, caplog
):
    files = read(engine.folder)
    FAMILY.save(make_scope(tmp_path, folders=[with_engine(engine, {"VLLM_X": "a"})]))
    shutil.rmtree(engine.folder)
    here = with_engine(engine, {"VLLM_X": "b"})
    caplog.set_level(logging.INFO)
    moved = FAMILY.restore(make_scope(tmp_path, folders=[here]))
    assert moved.copied == 2 and read(engine.folder) == files  # it may still hit in part
    assert moved.notes == [
        f"vllm: restored, but the engine will miss: VLLM_X is 'b' here, 'a' where it was "
        f"written; {FIX}"
    ]
    assert "declared-folders vllm: restored (hit), but the engine will miss: VLLM_X" in caplog.text


def test_a_folder_restored_at_another_path_names_both_where_the_engine_keys_on_it(tmp_path, engine):
    FAMILY.save(make_scope(tmp_path, folders=[with_engine(engine, {})]))
    elsewhere = with_engine(engine, {}, folder=tmp_path / "other")
    one = FAMILY.restore_one(make_scope(tmp_path, folders=[elsewhere]), elsewhere)
    assert one.hit and f"path {tmp_path / 'other'} here, {engine.folder} there" in one.will_miss
    flash = with_engine(engine, {}, engine="flashinfer", folder=tmp_path / "third")
    assert not FAMILY.restore_one(make_scope(tmp_path, folders=[flash]), flash).will_miss


def test_equal_engine_facts_warn_of_nothing(tmp_path, engine):
    env = {"VLLM_X": "a", "HOME": "/home/server", "VLLM_API_KEY": "k"}
    FAMILY.save(make_scope(tmp_path, folders=[with_engine(engine, env)]))
    here = with_engine(engine, dict(env))
    scope = make_scope(tmp_path, folders=[here])
    got = FAMILY.explain(scope, host(), Sources())
    assert (got.outcome, got.note) == ("hit", "")
    assert FAMILY.restore(scope).notes == []


def test_a_token_never_reaches_the_stored_folder(tmp_path, engine):
    token = "hf_SECRETsecretSECRET"
    saved = with_engine(engine, {"VLLM_HF_TOKEN": token, "VLLM_X": "a"})
    scope = make_scope(tmp_path, folders=[saved])
    FAMILY.save(scope)
    index = next((tmp_path / "volume" / FOLDER / "models").rglob("*.json"))
    assert token not in index.read_text() and "VLLM_HF_TOKEN" in index.read_text()
    # another token is no miss (a secret is recorded as set: no digest to guess it from);
    # a token gone is, named without a value
    here = with_engine(engine, {"VLLM_HF_TOKEN": "hf_other", "VLLM_X": "a"})
    note = FAMILY.explain(make_scope(tmp_path, folders=[here]), host(), Sources()).note
    assert "differs" not in note
    gone = with_engine(engine, {"VLLM_X": "a"})
    note = FAMILY.explain(make_scope(tmp_path, folders=[gone]), host(), Sources()).note
    assert "VLLM_HF_TOKEN differs" in note and "hf_" not in note


def test_a_folder_stored_without_a_record_explains_as_before(tmp_path, engine):
    FAMILY.save(make_scope(tmp_path, folders=[engine]))  # an older save: no engine facts
    here = with_engine(engine, {"VLLM_X": "b"}, folder=tmp_path / "elsewhere")
    scope = make_scope(tmp_path, folders=[here])
    got = FAMILY.explain(scope, host(), Sources())
    assert (got.outcome, got.note) == ("hit", "")
    assert FAMILY.restore(scope).notes == [] and FAMILY.restore(scope).present == 2
