"""Compiled models' artifacts in bundles: packed whole from a family, verified, installed
into another family at another path (all or nothing), rolled back, size-bounded."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from registry import BundleRejected, Store
from registry.bundles import bundle
from registry.caches import inductor_cache
from registry.core.errors import BadInput, RegistryError
from registry.core.fingerprint import cpu_fingerprint
from registry.families import bundle_indexed
from registry.families.inductor import RECORD_KEY
from registry.storage.store import CURRENT
from tests.conftest import gpu_fingerprint
from tests.registry._bundles import UNSIGNED_OK, refused
from tests.registry.bundles.test_bundle import _listed, _members, _rebuild

FP = cpu_fingerprint()
KEY = "0123456789abcdef"
FILES = {
    "fxgraph/ab/fabc/entry": b"graph",
    "aotautograd/aq/entry": b"autograd",
    "ab/cabc.so": b"\x7fELF kernel",
}


def family(root: Path, files: dict[str, bytes] = FILES, *, model="mlp", key=KEY, fp=FP) -> Path:
    cache = root.parent / f"{root.name}-cache-{model}"
    for rel, data in files.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    inductor_cache.save(cache, root, model=model, key_digest=key, key={}, fingerprint=fp)
    return root


def restored(root: Path, cache: Path, *, model="mlp", key=KEY) -> dict[str, bytes]:
    done = inductor_cache.restore(root, cache, model=model, key_digest=key, fingerprint=FP)
    assert done.quarantined == 0
    return {
        p.relative_to(cache).as_posix(): p.read_bytes() for p in cache.rglob("*") if p.is_file()
    }


@pytest.fixture
def packed(tmp_path):
    family(tmp_path / "a" / "inductor")
    out = tmp_path / "models.tgz"
    bundle.create(
        out, name="models", version="1", entries=[], roots={"inductor": tmp_path / "a" / "inductor"}
    )
    return out


def test_a_model_travels_by_bundle_to_a_family_at_another_path(tmp_path, packed):
    verified = bundle.verify(packed, trust=UNSIGNED_OK)
    assert len(verified.parts["inductor"].indexes) == 1 and len(
        verified.parts["inductor"].files
    ) == len(FILES)
    assert verified.manifest["fingerprints"][0]["digest"] == FP.digest()
    target = tmp_path / "elsewhere" / "volume" / "inductor"
    info = bundle.install(
        packed,
        Store(tmp_path / "store", create=True),
        expect=FP,
        roots={"inductor": target},
        trust=UNSIGNED_OK,
    )
    assert info["models"] == 1 and list(info[RECORD_KEY]) == verified.parts["inductor"].indexes
    assert restored(target, tmp_path / "cache") == FILES
    assert not list(target.glob(".bundle-*"))  # the staging folder is gone


def test_rollback_puts_back_the_index_the_install_replaced(tmp_path, packed):
    target = family(tmp_path / "t" / "inductor", {"old/file": b"before the bundle"})
    store = Store(tmp_path / "store", create=True)
    bundle.install(packed, store, expect=FP, roots={"inductor": target}, trust=UNSIGNED_OK)
    assert restored(target, tmp_path / "new") == FILES
    bundle.rollback(store, roots={"inductor": target})
    assert restored(target, tmp_path / "old") == {"old/file": b"before the bundle"}


def test_rollback_removes_an_index_that_was_not_there_before(tmp_path, packed):
    target, store = tmp_path / "t" / "inductor", Store(tmp_path / "store", create=True)
    bundle.install(packed, store, expect=FP, roots={"inductor": target}, trust=UNSIGNED_OK)
    bundle.rollback(store, roots={"inductor": target})
    done = inductor_cache.restore(
        target, tmp_path / "c", model="mlp", key_digest=KEY, fingerprint=FP
    )
    assert done.index is None and done.why_not == "no artifacts of model mlp are stored"


def test_rollback_without_the_family_leaves_its_indexes_and_says_so(tmp_path, packed, caplog):
    target, store = tmp_path / "t" / "inductor", Store(tmp_path / "store", create=True)
    bundle.install(packed, store, expect=FP, roots={"inductor": target}, trust=UNSIGNED_OK)
    bundle.rollback(store)
    assert "indexes stay" in caplog.text
    assert restored(target, tmp_path / "c") == FILES


def test_an_index_for_another_machine_rejects_unless_forced(tmp_path):
    h100 = gpu_fingerprint("NVIDIA H100", sms=132)
    source = family(tmp_path / "a", fp=h100)
    out = tmp_path / "h100.tgz"
    bundle.create(out, name="m", version="1", entries=[], roots={"inductor": source})
    target = tmp_path / "t"
    with pytest.raises(BundleRejected, match=r"compiled model index .* another platform"):
        bundle.install(
            out,
            Store(tmp_path / "s", create=True),
            expect=FP,
            roots={"inductor": target},
            trust=UNSIGNED_OK,
        )
    assert not target.exists()
    bundle.install(
        out,
        Store(tmp_path / "s", create=True),
        expect=FP,
        force=True,
        roots={"inductor": target},
        trust=UNSIGNED_OK,
    )
    assert len(list(target.glob("models/*/*/*/*.json"))) == 1


def test_create_takes_one_model_when_asked(tmp_path):
    root = family(tmp_path / "f")
    family(root, {"other": b"x"}, model="other")
    out = tmp_path / "one.tgz"
    bundle.create(out, name="m", version="1", entries=[], only="other", roots={"inductor": root})
    [index] = bundle.verify(out, trust=UNSIGNED_OK).parts["inductor"].indexes
    assert index.startswith("models/other/")
    with pytest.raises(BadInput, match="no artifacts of model nope"):  # a name given: exit 2
        bundle.create(
            tmp_path / "x.tgz",
            name="m",
            version="1",
            entries=[],
            only="nope",
            roots={"inductor": root},
        )


def test_create_refuses_a_family_short_of_a_file_or_with_a_damaged_one(tmp_path):
    root = family(tmp_path / "f")
    blob = next(p for p in (root / "blobs").rglob("*") if p.is_file())
    blob.write_bytes(b"rot")
    with pytest.raises(RegistryError, match="no longer hashes to its name"):
        bundle.create(
            tmp_path / "x.tgz", name="m", version="1", entries=[], roots={"inductor": root}
        )
    blob.unlink()
    with pytest.raises(RegistryError, match="lacks"):
        bundle.create(
            tmp_path / "x.tgz", name="m", version="1", entries=[], roots={"inductor": root}
        )
    assert not (tmp_path / "x.tgz").exists()


def _index_name(built: Path) -> str:
    return next(n for n in _members(built) if n.startswith("inductor/models/"))


def _blob_name(built: Path) -> str:
    return next(n for n in _members(built) if n.startswith("inductor/blobs/"))


def _moved_index(built: Path):
    """The index at the path of another model: it names itself 'mlp'."""
    name = _index_name(built)
    data = _members(built)[name]
    moved = name.replace("/mlp/", "/other/")

    def edit(manifest):
        manifest["members"].pop(name)
        _listed(manifest, moved, data)

    return dict(drop=[name], extra=[], manifest_edit=edit, replace={moved: data})


def _orphan_blob(built: Path):
    data = b"nobody names me"
    sha = hashlib.sha256(data).hexdigest()
    name = f"inductor/blobs/{sha[:2]}/{sha}"
    return dict(replace={name: data}, manifest_edit=lambda m: _listed(m, name, data))


def _short_of_a_blob(built: Path):
    name = _blob_name(built)
    return dict(drop=[name], manifest_edit=lambda m: m["members"].pop(name))


def _misnamed_blob(built: Path):
    name = _blob_name(built)
    data = b"other bytes"
    return dict(replace={name: data}, manifest_edit=lambda m: _listed(m, name, data))


def _stray(built: Path):
    data = b"x"
    return dict(
        replace={"inductor/elsewhere/x": data},
        manifest_edit=lambda m: _listed(m, "inductor/elsewhere/x", data),
    )


def _size_differs(built: Path):
    name = _index_name(built)
    index = json.loads(_members(built)[name])
    rel = next(iter(index["files"]))
    index["files"][rel][1] += 1
    data = json.dumps(index).encode()
    return dict(replace={name: data}, manifest_edit=lambda m: _listed(m, name, data))


def _fingerprint_unlisted(built: Path):
    return dict(manifest_edit=lambda m: m.update(fingerprints=[]))


def _index_escapes(built: Path):
    name = _index_name(built)
    index = json.loads(_members(built)[name])
    index["files"]["../../etc/cron.d/x"] = next(iter(index["files"].values()))
    data = json.dumps(index).encode()
    return dict(replace={name: data}, manifest_edit=lambda m: _listed(m, name, data))


@pytest.mark.parametrize(
    "fault,expected",
    [
        (_moved_index, "belong elsewhere"),
        (_orphan_blob, "named by no index"),
        (_short_of_a_blob, "which it lacks"),
        (_misnamed_blob, "not its name"),
        (_stray, "is neither inductor/models"),
        (_index_escapes, "not a plain relative path"),
        (_size_differs, "its blob has"),
        (_fingerprint_unlisted, "not listed in MANIFEST.json 'fingerprints'"),
    ],
)
def test_install_refuses_a_faulty_model_bundle_and_changes_nothing(
    tmp_path, packed, fault, expected
):
    bad = _rebuild(packed, tmp_path / "bad.tgz", **fault(packed))
    target = family(tmp_path / "t" / "inductor", {"old/file": b"kept"})
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    store = Store(tmp_path / "store", create=True)
    with pytest.raises(BundleRejected, match=expected):
        bundle.install(bad, store, expect=FP, roots={"inductor": target}, trust=UNSIGNED_OK)
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    assert not (tmp_path / "store" / CURRENT).exists()


def test_install_without_a_family_refuses_a_bundle_that_carries_models(tmp_path, packed):
    with pytest.raises(BundleRejected, match="no inductor folder"):
        bundle.install(packed, Store(tmp_path / "s", create=True), expect=FP, trust=UNSIGNED_OK)


def test_size_bounds_hold_for_indexes_and_blobs(tmp_path, packed):
    with pytest.raises(BundleRejected, match=r"index .* limit 10"):
        bundle.verify(packed, max_index_bytes=10, trust=UNSIGNED_OK)
    with pytest.raises(BundleRejected, match="JSON values"):
        bundle.verify(packed, max_index_values=3, trust=UNSIGNED_OK)
    with pytest.raises(BundleRejected, match="limit 5"):
        bundle.verify(packed, max_member_bytes=5, trust=UNSIGNED_OK)


def test_the_cli_packs_installs_and_rolls_back_a_model(tmp_path, packed, capsys):
    from warmup.cli import main

    source = tmp_path / "a" / "inductor"
    out, target = tmp_path / "cli.tgz", tmp_path / "vol" / "inductor"
    store = ["registry", "--store", str(tmp_path / "store")]
    assert main([*store, "bundle", "create", str(out), "--name", "m", "--version", "1",
                 "--inductor", str(source)]) == 0  # fmt: skip
    assert "1 compiled model indexes (3 files)" in capsys.readouterr().out
    assert main([*store, "--create-store", "bundle", "install", str(out), "--allow-unsigned",
                 "--fingerprint", "cpu", "--inductor", str(target)]) == 0  # fmt: skip
    assert restored(target, tmp_path / "c1") == FILES
    assert main([*store, "rollback", "--inductor", str(target)]) == 0
    assert not list(target.glob("models/*/*/*/*.json"))
    assert main([*store, "bundle", "create", str(out), "--name", "m", "--version", "1",
                 "--model", "mlp"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "stored by name in --inductor or " in err and "--caches; give one" in err


def test_an_interrupted_writers_temporary_index_is_no_index(tmp_path):
    root = family(tmp_path / "f")
    [index] = inductor_cache.index_files(root / "models")
    (index.parent / f".tmp-1234-{index.name}").write_text("{half an ind")
    out = tmp_path / "b.tgz"
    bundle.create(out, name="m", version="1", entries=[], roots={"inductor": root})
    assert len(bundle.verify(out, trust=UNSIGNED_OK).parts["inductor"].indexes) == 1


def test_two_installs_of_one_index_roll_back_one_at_a_time(tmp_path):
    store, target = (
        Store(tmp_path / "store", create=True),
        family(tmp_path / "t", {"v0": b"before"}),
    )
    for version in (1, 2):
        source = family(tmp_path / f"s{version}", {f"v{version}": b"x" * version})
        out = tmp_path / f"v{version}.tgz"
        bundle.create(out, name="m", version=str(version), entries=[], roots={"inductor": source})
        bundle.install(out, store, expect=FP, roots={"inductor": target}, trust=UNSIGNED_OK)
    assert restored(target, tmp_path / "c2") == {"v2": b"xx"}
    bundle.rollback(store, roots={"inductor": target})
    assert restored(target, tmp_path / "c1") == {"v1": b"x"}
    bundle.rollback(store, roots={"inductor": target})
    assert restored(target, tmp_path / "c0") == {"v0": b"before"}


def test_an_index_whose_file_did_not_move_in_is_left_out(tmp_path, packed, monkeypatch):
    """After the swap a blob that cannot move is logged; the index naming it stays out
    (its model recompiles) rather than name a file the family lacks."""
    real = os.replace

    def replace(src, dst):
        if "/blobs/" in str(dst) and str(dst).endswith(hashlib.sha256(b"graph").hexdigest()):
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "t"
    bundle.install(
        packed,
        Store(tmp_path / "s", create=True),
        expect=FP,
        roots={"inductor": target},
        trust=UNSIGNED_OK,
    )
    monkeypatch.setattr(os, "replace", real)
    assert not list(inductor_cache.index_files(target / "models"))


def _copies(count: int, size: int = 64 * 2**10) -> dict[str, bytes]:
    """``count`` paths of one content: one blob, ``count`` files a restore writes."""
    return {f"fxgraph/c{i}/entry": b"\x01" * size for i in range(count)}


def test_one_blob_under_many_paths_counts_once_a_path_against_the_total(tmp_path):
    family(tmp_path / "a" / "inductor", _copies(40))
    out = tmp_path / "many.tgz"
    bundle.create(
        out, name="m", version="1", entries=[], roots={"inductor": tmp_path / "a" / "inductor"}
    )
    assert out.stat().st_size < 64 * 2**10  # 40 files of 64 KiB, carried as one blob
    limit = 2**20  # the members come to 64 KiB and an index; the files to 2.5 MiB
    with pytest.raises(
        BundleRejected, match=rf"inductor/models/mlp/.*restore {40 * 2**16} bytes.*limit {limit}"
    ):
        bundle.verify(out, max_total_bytes=limit, trust=UNSIGNED_OK)
    target = family(tmp_path / "t" / "inductor", {"old/file": b"kept"})
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    refused(
        out,
        tmp_path / "s",
        match=f"limit {limit}",
        expect=FP,
        roots={"inductor": target},
        max_total_bytes=limit,
    )
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    assert (
        len(bundle.verify(out, trust=UNSIGNED_OK).parts["inductor"].indexes) == 1
    )  # within the default total


def test_a_path_two_indexes_give_the_same_blob_counts_once(tmp_path):
    root = tmp_path / "a" / "inductor"
    family(root, _copies(10), model="mlp")
    family(root, _copies(10), model="other")
    out = tmp_path / "two.tgz"
    bundle.create(out, name="m", version="1", entries=[], roots={"inductor": root})
    verified = bundle.verify(
        out, max_total_bytes=10 * 2**16 + 2**16, trust=UNSIGNED_OK
    )  # not 20 files' worth
    assert len(verified.parts["inductor"].indexes) == 2
    with pytest.raises(BundleRejected, match="restore"):
        bundle.verify(out, max_total_bytes=10 * 2**16 - 1, trust=UNSIGNED_OK)


def test_the_files_all_indexes_restore_are_bounded_in_count(tmp_path, monkeypatch):
    family(tmp_path / "a" / "inductor", _copies(5, size=1))
    out = tmp_path / "count.tgz"
    bundle.create(
        out, name="m", version="1", entries=[], roots={"inductor": tmp_path / "a" / "inductor"}
    )
    monkeypatch.setattr(bundle_indexed, "MAX_BUNDLE_FILES", 4)
    with pytest.raises(BundleRejected, match="restore 5 files; limit 4"):
        bundle.verify(out, trust=UNSIGNED_OK)


def test_what_all_the_families_restore_together_is_bounded_once(tmp_path):
    from registry.families.declared import FOLDER

    blob = os.urandom(10_000)
    source = tmp_path / "made"
    source.mkdir()
    for name in ("a.bin", "b.bin", "c.bin"):  # one blob, restored at three paths
        (source / name).write_bytes(blob)
    volume = tmp_path / "volume"
    for root, name in ((volume / "inductor", "m"), (volume / FOLDER, "vllm")):
        inductor_cache.save(source, root, model=name, key_digest=KEY, key={}, fingerprint=FP)
    out = tmp_path / "both.tgz"
    bundle.create(out, name="b", version="1", entries=[], roots=bundle.on_volume(volume))
    assert bundle.verify(out, max_total_bytes=70_000, trust=UNSIGNED_OK)
    with pytest.raises(BundleRejected, match="restore 60000 bytes"):
        bundle.verify(
            out, max_total_bytes=40_000, trust=UNSIGNED_OK
        )  # each family's 30,000 fits alone
