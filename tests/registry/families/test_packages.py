"""Compiled packages: one folder per declared model, stored by key and host, restored
at any pod path for the same key and host only, carried by bundles and the remote tier
under their own names."""

from __future__ import annotations

import shutil

import pytest

from registry import Store
from registry.bundles import bundle
from registry.caches.triton_cache import Origin
from registry.families import Sources, named
from registry.families.base import Declared, Host
from registry.families.packages import NAMESPACE
from registry.remote import models as remote_models
from tests.registry._bundles import UNSIGNED_OK
from tests.registry.families.conftest import FP, make_scope, read, write

FAMILY = named("packages")
PACKAGE = {"model.pt2": b"PK\x03\x04 a package", "package.json": b'{"key_digest": "k"}'}


def scope(root, models, **extra):
    made = make_scope(root, models=models, **extra)
    return made.__class__(**{**made.__dict__, "pod": {"package_dir": root / "pod" / "packages"}})


@pytest.fixture
def models():
    return [Declared("blocks", "a" * 32, {"build": "m:blocks"}), Declared("mlp", "b" * 32)]


def test_each_model_has_its_own_folder_saved_and_restored(tmp_path, models):
    here = scope(tmp_path, models)
    write(here.folder("package_dir") / "blocks", PACKAGE)
    write(here.folder("package_dir") / "mlp", {"failed.json": b'{"reason": "no export"}'})
    saved = FAMILY.save(here)
    assert (saved.copied, saved.notes) == (3, [])
    assert (tmp_path / "volume" / "packages" / "blobs").is_dir()
    shutil.rmtree(here.folder("package_dir"))
    other = scope(tmp_path / "pod2", models)
    other = other.__class__(**{**other.__dict__, "volume": here.volume})
    restored = FAMILY.restore(other)
    assert (restored.copied, restored.notes) == (3, [])
    assert read(other.folder("package_dir") / "blocks") == PACKAGE
    assert read(other.folder("package_dir") / "mlp") == {"failed.json": b'{"reason": "no export"}'}


def test_another_key_misses_and_says_why(tmp_path, models):
    here = scope(tmp_path, models[:1])
    write(here.folder("package_dir") / "blocks", PACKAGE)
    FAMILY.save(here)
    changed = Declared("blocks", "c" * 32)
    moved = FAMILY.restore(scope(tmp_path, [changed]))
    assert moved.copied == 0 and "other code or shapes" in moved.notes[0]


def test_it_is_a_family_of_its_own_with_a_bundle_option_and_a_pod_folder():
    assert FAMILY.needs_host and FAMILY.option is not None
    assert FAMILY.option.flag == "--packages"
    assert [f.name for f in FAMILY.folders] == ["package_dir"]
    assert FAMILY.namespace == NAMESPACE != remote_models.MODELS


def test_explain_says_whether_a_package_is_stored(tmp_path, models):
    here = scope(tmp_path, models[:1])
    host = Host(FP, Origin.of(FP, {}))
    assert FAMILY.explain(here, host, Sources()).outcome == "miss"
    write(here.folder("package_dir") / "blocks", PACKAGE)
    FAMILY.save(here)
    assert FAMILY.explain(here, host, Sources()).outcome == "hit"


def test_a_bundle_carries_packages_per_model(tmp_path, models):
    here = scope(tmp_path / "a", models[:1])
    write(here.folder("package_dir") / "blocks", PACKAGE)
    FAMILY.save(here)
    out = tmp_path / "packages.tgz"
    bundle.create(
        out, name="p", version="1", entries=[], roots=bundle.on_volume(tmp_path / "a" / "volume")
    )
    verified = bundle.verify(out, trust=UNSIGNED_OK)
    assert len(verified.parts["packages"].indexes) == 1
    target = tmp_path / "b" / "volume"
    store = Store(target / "registry", create=True)
    bundle.install(out, store, expect=None, roots=bundle.on_volume(target), trust=UNSIGNED_OK)
    there = scope(tmp_path / "b", models[:1])
    assert FAMILY.restore(there).copied == 2
    assert read(there.folder("package_dir") / "blocks") == PACKAGE


def test_explain_names_a_model_stored_without_a_package_and_why(tmp_path, models):
    here = scope(tmp_path, models[:1])
    failed = b'{"stage": "export", "reason": "a data-dependent branch"}'
    write(here.folder("package_dir") / "blocks", {"failed.json": failed})
    FAMILY.save(here)
    found = FAMILY.explain(here, Host(FP, Origin.of(FP, {})), Sources())
    assert found.outcome == "hit"  # the record is what a pod restores: no export again
    assert "blocks: no package (export failed: a data-dependent branch)" in found.line()
    assert FAMILY.why_none(here, models[0]) == "export failed: a data-dependent branch"
