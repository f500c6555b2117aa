"""``explain``'s predictions through its entry point: a declared folder stored under one
engine environment and explained under another names the variable that differs."""

from __future__ import annotations

from registry.caches.triton_cache import Origin
from registry.core.fingerprint import cpu_fingerprint
from registry.families import Host
from tests.conftest import settings_for, write_manifest
from tests.registry.families.conftest import write
from warmup.caches import families
from warmup.caches.explain import explain
from warmup.core.manifest import load_manifest
from warmup.core.services import Services


def declared(predictions):
    return next(p for p in predictions if p.family == "declared-folders")


def test_explain_names_the_engine_variable_that_differs_from_the_saved_folders(
    tmp_path, monkeypatch
):
    folder = write(tmp_path / "engine", {"torch_compile_cache/abc/rank_0_0/model.py": b"g"})
    text = (
        "version: 1\nentries:\n"
        "  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: 8, N: 8, K: 8}]}\n"
        f'caches:\n  - {{name: vllm, path: "{folder}", key: "qwen tp2", engine: vllm}}\n'
    )
    manifest = load_manifest(write_manifest(tmp_path / "m.yaml", text))
    services = Services(settings_for(tmp_path))
    fingerprint = cpu_fingerprint()
    monkeypatch.setenv("VLLM_TEST_KNOB", "a")
    families.save(families.scope(services, manifest, fingerprint=fingerprint))
    host = Host(fingerprint.with_kernel(""), Origin.of(fingerprint, {}))
    assert declared(explain(services, manifest, host, remote=None)).outcome == "hit"

    monkeypatch.setenv("VLLM_TEST_KNOB", "b")
    got = declared(explain(services, manifest, host, remote=None))
    assert (got.outcome, got.factor) == ("miss", "env VLLM_TEST_KNOB")
    assert "VLLM_TEST_KNOB is 'b' here, 'a' where it was written" in got.line()
