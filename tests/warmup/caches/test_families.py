"""The families driven for one pod: the scope a manifest gives them, and loops that go
on past one family's failure."""

from __future__ import annotations

import logging

import pytest

from registry import families as registry_families
from registry.core.fingerprint import cpu_fingerprint
from registry.families.base import Moved
from registry.families.engine_key import RECORD, EngineKey
from tests.conftest import settings_for, write_manifest
from tests.warmup.compiled.models import manifest as models_manifest
from warmup.caches import families
from warmup.core.manifest import load_manifest
from warmup.core.services import Services

CACHES = """
caches:
  - {name: vllm, path: /srv/vllm-cache, key: "qwen3-8b rev1 tp2"}
  - {name: sglang, path: /srv/sglang, key: "qwen3-8b rev1 tp2"}
"""


def test_the_scope_keys_each_declared_folder_and_model(tmp_path):
    text = models_manifest(("mlp", "mlp", "{batch: [2], seq: [4]}")) + CACHES
    manifest = load_manifest(write_manifest(tmp_path / "m.yaml", text))
    scope = families.scope(Services(settings_for(tmp_path)), manifest)
    assert [(f.name, str(f.folder)) for f in scope.folders] == [
        ("vllm", "/srv/vllm-cache"),
        ("sglang", "/srv/sglang"),
    ]
    vllm, sglang = scope.folders
    assert vllm.key_digest != sglang.key_digest  # the name enters the key, the path does not
    assert vllm.key_digest == families.folder_key_digest("vllm", "qwen3-8b rev1 tp2")
    assert [m.name for m in scope.models] == ["mlp"] and len(scope.models[0].key_digest) == 32
    assert scope.fingerprint is None
    assert families.scope(Services(settings_for(tmp_path)), None).folders == ()


def test_one_familys_failure_is_noted_and_the_others_go_on(tmp_path, monkeypatch, caplog):
    def broken(scope):
        raise OSError("disk gone")

    monkeypatch.setattr(registry_families.named("triton-kernels"), "restore", broken)
    caplog.set_level(logging.INFO)
    moved = families.restore(families.scope(Services(settings_for(tmp_path)), None))
    assert [m.family for m in moved] == families.names()
    failed = next(m for m in moved if m.family == "triton-kernels")
    assert failed.notes == ["restore failed: OSError: disk gone"]
    assert "triton-kernels: restore failed: OSError: disk gone" in caplog.text


def test_restore_can_take_only_the_families_that_need_the_host(tmp_path):
    scope = families.scope(Services(settings_for(tmp_path)), None, fingerprint=cpu_fingerprint())
    keyed = [m.family for m in families.restore(scope, needing_host=True)]
    assert keyed == ["inductor", "packages", "declared-folders"]
    unkeyed = [m.family for m in families.restore(scope, needing_host=False)]
    assert set(keyed).isdisjoint(unkeyed) and len(keyed + unkeyed) == len(families.names())


def test_a_line_counts_what_moved():
    assert Moved("x", copied=1).line("saved") == "x: saved 1 file"
    line = Moved("x", copied=3, present=2, entries=4, notes=["a: miss"]).line("restored")
    assert line == "x: restored 3 files (2 already there) and 4 registry entries; a: miss"


def test_declared_folders_that_overlap_are_bad_input():
    from warmup.core.manifest import ManifestError, parse_manifest

    base = "version: 1\nmodels: []\nentries:\n" + (
        "  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: 8, N: 8, K: 8}]}\n"
    )
    nested = base + (
        'caches:\n  - {name: a, path: /srv/cache, key: "k"}\n'
        '  - {name: b, path: /srv/cache/vllm, key: "k"}\n'
    )
    with pytest.raises(ManifestError, match="b's path '/srv/cache/vllm' is inside a's"):
        parse_manifest(nested)
    apart = nested.replace("/srv/cache/vllm", "/srv/other")
    assert [c.name for c in parse_manifest(apart).caches] == ["a", "b"]


ENGINE_CACHES = """version: 1
entries:
  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: 8, N: 8, K: 8}]}
caches:
  - name: vllm
    path: /srv/vllm-cache
    key: "qwen3-8b rev1 tp2"
    engine: vllm
    key_env: ["MY_KNOB"]
    key_paths: ["/models/qwen3-8b"]
"""


def test_each_declared_folder_carries_this_pods_engine_facts_outside_its_digest(tmp_path):
    manifest = load_manifest(write_manifest(tmp_path / "m.yaml", ENGINE_CACHES))
    services = Services(settings_for(tmp_path))
    env = {"VLLM_X": "a", "MY_KNOB": "1", "PATH": "/bin", "VLLM_API_KEY": "sk-secret"}
    (vllm,) = families.scope(services, manifest, env=env).folders
    facts = EngineKey.from_json(vllm.key[RECORD])
    assert facts is not None and facts.path == "/srv/vllm-cache"
    assert dict(facts.env) == {"VLLM_X": "a", "MY_KNOB": "1"} and "VLLM_API_KEY" in facts.digests
    assert dict(facts.paths) == {"/models/qwen3-8b": False}
    assert vllm.key["key"] == "qwen3-8b rev1 tp2"
    (elsewhere,) = families.scope(services, manifest, env={"VLLM_X": "b"}).folders
    assert elsewhere.key_digest == vllm.key_digest  # never the environment in the digest
