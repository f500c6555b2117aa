"""Triton's compiled kernels and launcher stubs harvested one by one: taken when
finished, checked before anything is written, kept on the volume with their origin,
and shared (the stubs, host code, never)."""

from __future__ import annotations

import json

import pytest

from registry.caches import triton_cache
from registry.families import named
from registry.families.file_harvest import FileLimits, Refused
from registry.remote import triton as remote_triton
from tests.conftest import gpu_fingerprint
from tests.registry.families.conftest import fake_kernel, make_scope, read

FP = gpu_fingerprint()
KERNELS = named("triton-kernels")


@pytest.fixture
def scope(tmp_path):
    return make_scope(tmp_path, fingerprint=FP, triton_env={})


def test_it_takes_a_group_file_and_a_stub_of_a_cache_folder(scope):
    cache = scope.folder("triton_cache_dir")
    assert KERNELS.file_folders(scope) == [cache]
    assert KERNELS.file_kind(scope, cache / "K" / "__grp__k.json") == "kernel"
    assert KERNELS.file_kind(scope, cache / "K" / "launcher.so") == "stub"
    assert KERNELS.file_kind(scope, cache / "K" / "tmp.launcher.so") is None
    assert KERNELS.file_kind(scope, cache / "K" / "k.cubin") is None  # its group says when
    assert KERNELS.file_kind(scope, cache / "__grp__k.json") is None
    assert KERNELS.file_kind(scope, cache / "K" / "sub" / "__grp__k.json") is None
    assert dict(KERNELS.file_kinds) == {"kernel": "triton-kernels", "stub": "triton-stubs"}


def test_a_kernel_goes_to_the_volume_with_its_origin_and_is_shared_group_last(scope):
    group = fake_kernel(scope.folder("triton_cache_dir"))
    done = KERNELS.harvest_file(scope, "kernel", group, FileLimits())
    assert done.result == "harvested" and done.size == len(b"cubin bytes") + len(
        (group.parent / "k.json").read_bytes()
    )
    assert read(scope.volume.triton_cache / "KEYABC") == read(group.parent)
    assert triton_cache.origins(scope.volume.triton_cache)
    assert [(u.key, u.name) for u in done.uploads] == [
        ("KEYABC", "k.cubin"),
        ("KEYABC", "k.json"),
        ("KEYABC", "__grp__k.json"),
    ]
    assert json.loads(done.uploads[-1].data) == {"child_paths": ["k.cubin", "k.json"]}
    assert KERNELS.harvest_file(scope, "kernel", group, FileLimits()).result == "deduplicated"


def test_an_upload_is_sent_through_the_triton_remote_layout(scope, monkeypatch):
    sent = []
    monkeypatch.setattr(remote_triton, "publish", lambda *args: sent.append(args) or True)
    done = KERNELS.harvest_file(
        scope, "kernel", fake_kernel(scope.folder("triton_cache_dir")), FileLimits()
    )
    remote = object()
    assert all(u.send(remote, u) for u in done.uploads)  # type: ignore[arg-type]
    assert [a[:3] for a in sent] == [(remote, "KEYABC", u.name) for u in done.uploads]


def _foreign(group):
    (group.parent / "k.json").write_text(json.dumps({"target": {"arch": 80}}))


def _escaping(group):
    group.write_text(json.dumps({"child_paths": {"k.cubin": "/etc/passwd"}}))


def _no_metadata(group):
    group.write_text(json.dumps({"child_paths": {"k.cubin": str(group.parent / "k.cubin")}}))


def _names_nothing(group):
    group.write_text(json.dumps({"child_paths": {}}))


def _unreadable(group):
    group.write_text("[1]")


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (_foreign, "compiled for compute capability 8.0; this pod has 9.0"),
        (_escaping, "outside its folder"),
        (_no_metadata, "does not name its metadata"),
        (_names_nothing, "names no file"),
        (_unreadable, "unreadable group"),
    ],
)
def test_a_bad_kernel_is_refused_and_nothing_is_written(scope, spoil, why):
    group = fake_kernel(scope.folder("triton_cache_dir"))
    spoil(group)
    with pytest.raises(Refused, match=why):
        KERNELS.harvest_file(scope, "kernel", group, FileLimits())
    assert not scope.volume.triton_cache.exists()


def test_the_caps_bound_a_file_and_the_kernel(scope):
    group = fake_kernel(scope.folder("triton_cache_dir"))
    with pytest.raises(Refused, match="limit"):
        KERNELS.harvest_file(scope, "kernel", group, FileLimits(max_file_bytes=5))
    with pytest.raises(Refused, match="limit"):
        KERNELS.harvest_file(scope, "kernel", group, FileLimits(max_entry_bytes=15))


def test_a_folder_outside_the_cache_or_misnamed_is_refused(scope, tmp_path):
    elsewhere = fake_kernel(tmp_path / "elsewhere")
    with pytest.raises(Refused, match="not a folder of the Triton cache"):
        KERNELS.harvest_file(scope, "kernel", elsewhere, FileLimits())
    bad = fake_kernel(scope.folder("triton_cache_dir"), key="bad.name")
    with pytest.raises(Refused, match="not a folder of the Triton cache"):
        KERNELS.harvest_file(scope, "kernel", bad, FileLimits())


def test_a_stub_goes_to_the_volume_only_and_must_be_a_shared_object(scope):
    folder = scope.folder("triton_cache_dir") / "STUBKEY"
    folder.mkdir(parents=True)
    (folder / "launcher.so").write_bytes(b"\x7fELF host code")
    done = KERNELS.harvest_file(scope, "stub", folder / "launcher.so", FileLimits())
    assert (done.result, done.uploads) == ("harvested", ())
    assert (scope.volume.triton_cache / "STUBKEY" / "launcher.so").is_file()
    (folder / "other.so").write_bytes(b"#!/bin/sh")
    with pytest.raises(Refused, match="not a shared object"):
        KERNELS.harvest_file(scope, "stub", folder / "other.so", FileLimits())


def test_a_kind_it_does_not_take_or_an_unknown_host_is_refused(scope, tmp_path):
    group = fake_kernel(scope.folder("triton_cache_dir"))
    with pytest.raises(Refused, match="harvests no autotune file"):
        KERNELS.harvest_file(scope, "autotune", group, FileLimits())
    unknown = make_scope(tmp_path, fingerprint=None)
    group = fake_kernel(unknown.folder("triton_cache_dir"))
    with pytest.raises(Refused, match="host is not known"):
        KERNELS.harvest_file(unknown, "kernel", group, FileLimits())
