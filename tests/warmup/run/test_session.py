"""What a rank session does before any rank reads: the registry is recovered first."""

import os
import shutil

import pytest

import warmup
from registry import RegistryError, Store
from registry.store import CURRENT
from registry.volume import MissingFolder
from tests.conftest import settings_for, write_manifest
from warmup.manifest import load_manifest
from warmup.run.session import RunError, lock_backend, main, restore


def test_restore_cleans_what_a_killed_writer_left_and_repairs_current(tmp_path, make_entry):
    settings = settings_for(tmp_path)
    store = Store(settings.registry_dir, create=True)
    store.put_many([make_entry(m=m) for m in (1, 2)])
    gen = settings.registry_dir / os.readlink(settings.registry_dir / CURRENT)
    stale = gen / "ag_gemm" / ".tmp-123-x.json"
    stale.write_text("{")
    (gen / "GENERATION.json").unlink()
    restore(settings)
    assert not stale.exists()
    assert Store(settings.registry_dir).record().kind == "repair"
    assert len(Store(settings.registry_dir)) == 2


def test_a_store_that_cannot_be_recovered_is_read_as_it_is(tmp_path, monkeypatch, caplog):
    settings = settings_for(tmp_path)

    def refuse(self, **budget):
        raise RegistryError("write lock not acquired within 1 s")

    monkeypatch.setattr(Store, "recover", refuse)
    restore(settings)  # a read-only mount or a stuck lock never stops the warmup
    assert "not recovered (write lock not acquired" in caplog.text


MANIFEST = """
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}
"""
NOBODY = "redis://127.0.0.1:1/0"  # port 1: connection refused at once


def test_a_lock_server_that_does_not_answer_is_one_clear_error_or_a_fallback(tmp_path):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    settings = settings_for(tmp_path, manifest=manifest, lock_url=NOBODY)
    with pytest.raises(RunError, match=r"lock server redis://127.0.0.1:1/0 unreachable"):
        lock_backend(settings, load_manifest(manifest), 1)
    fallback = settings.model_copy(update={"lock_fallback": "file"})
    chosen = lock_backend(fallback, load_manifest(manifest), 1)
    assert chosen.lock_url == str(settings.paths.locks)
    assert chosen.remote_url == "off"  # the tier that followed the lock server goes with it
    given = settings_for(
        tmp_path, manifest=manifest, lock_url=NOBODY, remote_url=NOBODY, lock_fallback="file"
    )
    assert lock_backend(given, load_manifest(manifest), 1).remote_url == NOBODY  # as given


def test_warm_in_process_checks_the_lock_server_before_warming(tmp_path):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    settings = settings_for(tmp_path, manifest=manifest, lock_url=NOBODY, create_volume=True)
    with pytest.raises(RunError, match="unreachable"):  # once: each shape waited its timeout
        warmup.warm(manifest, settings)
    assert not settings.status_file.exists()


def test_warm_and_a_torchrun_rank_make_no_volume_nobody_asked_for(tmp_path, monkeypatch, capsys):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    settings = settings_for(tmp_path, manifest=manifest)
    with pytest.raises(MissingFolder, match=r"pass Settings\(create_volume=True\)") as info:
        warmup.warm(manifest, settings)
    assert "--create-volume" not in str(info.value)  # a Python caller's words, not a flag
    assert not settings.volume.exists() and not settings.work_dir.exists()
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "TRITON_WARMUP_VOLUME": str(settings.volume),
        "TRITON_WARMUP_WORK_DIR": str(settings.work_dir),
        "TRITON_WARMUP_MANIFEST": str(manifest),
        "TRITON_WARMUP_DEVICE": "cpu",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "CUDA_CACHE_PATH"):
        monkeypatch.setenv(name, "")  # put back after the rank sets them
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "")
    monkeypatch.setenv("TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER", "")
    assert main() == 2
    err = capsys.readouterr().err
    assert "volume" in err and "TRITON_WARMUP_CREATE_VOLUME=true" in err
    assert not settings.volume.exists() and not settings.work_dir.exists()


def test_the_runs_end_saves_a_declared_folder_and_restores_it_for_the_next_pod(tmp_path):
    from types import SimpleNamespace

    from registry.fingerprint import cpu_fingerprint
    from warmup.run.session import _save_caches

    engine = tmp_path / "engine"
    text = MANIFEST + f'caches:\n  - {{name: vllm, path: "{engine}", key: "qwen tp1"}}\n'
    manifest = load_manifest(write_manifest(tmp_path / "m.yaml", text))
    settings = settings_for(tmp_path)
    settings.paths.registry.mkdir(parents=True)
    (engine / "compiled").mkdir(parents=True)
    (engine / "compiled" / "graph.py").write_bytes(b"made by the engine")
    report = SimpleNamespace(fingerprint=cpu_fingerprint().to_json())
    saved = _save_caches(settings, manifest, [report])
    assert saved.copied == 1
    shutil.rmtree(engine)  # the next pod: a fresh folder
    _save_caches(settings, manifest, [report])
    assert (engine / "compiled" / "graph.py").read_bytes() == b"made by the engine"
