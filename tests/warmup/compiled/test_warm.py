"""The whole path of a compiled model on CPU (Inductor's C++ backend): declared, warmed
and stored by one pod, restored by a pod whose volume, work folder and home are
elsewhere, then served by a fresh process at yet another path with nothing compiled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import settings_for, write_manifest
from warmup.manifest import load_manifest
from warmup.run.launch import run

ROOT = Path(__file__).resolve().parents[3]
MLP = """\
version: 1
models:
  - name: mlp
    build: tests.warmup.compiled.models:mlp
    dims: {batch: [1, 2], seq: 3}
    inputs:
      - {shape: [batch, seq, 32], dtype: fp32}
      - {shape: [batch], dtype: int64, high: 3}
"""

pytestmark = pytest.mark.slow


def warm(root: Path, text: str, monkeypatch: pytest.MonkeyPatch, **extra):
    root.mkdir(parents=True, exist_ok=True)
    path = write_manifest(root / "manifest.yaml", text)
    monkeypatch.setenv("HOME", str(root / "home"))  # the rank processes inherit it
    settings = settings_for(root, manifest=path, **extra)
    return settings, run(settings, load_manifest(path))


def serve(work: Path, manifest: Path, name: str, *extra: dict, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.warmup.compiled._server", name, *map(json.dumps, extra)],
        cwd=ROOT,
        env={
            **os.environ,
            "HOME": str(work.parent / "home"),
            "TRITON_WARMUP_WORK_DIR": str(work),
            "TRITON_WARMUP_MANIFEST": str(manifest),
            "TRITON_WARMUP_VOLUME": str(work.parent / "volume"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_model_warmed_by_one_pod_is_served_by_another_at_another_path_without_compiling(
    tmp_path, monkeypatch
):
    _, first = warm(tmp_path / "a", MLP, monkeypatch)
    assert first.ready, first.failures
    [model] = first.models
    assert model.phase == "warm" and len(model.shapes) == 2
    assert model.counts["inductor_compiles"] == 2 and model.stored_artifacts > 0
    assert model.restore.startswith("miss: no artifacts of model mlp")

    # pod B: the volume moved to another path, a new work folder and home; A is gone
    shutil.copytree(tmp_path / "a" / "volume", tmp_path / "b" / "volume", symlinks=True)
    shutil.rmtree(tmp_path / "a")
    _, second = warm(tmp_path / "b", MLP, monkeypatch)
    assert second.ready, second.failures
    [model] = second.models
    assert model.restore == "hit"
    assert model.counts["inductor_compiles"] == 0 and model.counts["fxgraph_hits"] == 2

    # the server: the pod's work folder seen at yet another path, B's gone
    shutil.copytree(tmp_path / "b", tmp_path / "c", symlinks=True)
    shutil.rmtree(tmp_path / "b")
    served = serve(tmp_path / "c" / "work", tmp_path / "c" / "manifest.yaml", "mlp")
    assert served["error"] is None and served["guarded"] == {}
    assert not any(served["counts"].values()), served["counts"]  # Dynamo's too: primed


def test_a_shape_outside_the_manifest_is_counted_per_model_and_refused_when_strict(
    tmp_path, monkeypatch
):
    settings, status = warm(tmp_path, MLP, monkeypatch)
    assert status.ready, status.failures
    manifest, unlisted = settings.manifest, {"batch": 5, "seq": 3}
    counted = serve(settings.work_dir, manifest, "mlp", unlisted)
    assert counted["error"] is None
    assert counted["guarded"]["mlp/inductor_compiles"] == 1
    assert counted["guarded"]["mlp/dynamo_frames"] >= 1
    strict = serve(
        settings.work_dir, manifest, "mlp", unlisted, TRITON_WARMUP_COMPILE_GUARD="strict"
    )
    assert strict["error"].startswith("RequestCompileError: model 'mlp'")
    # the first server left batch 5's graph in the pod's cache: a Dynamo compile only
    assert set(strict["guarded"]) == {"mlp/dynamo_frames"}
