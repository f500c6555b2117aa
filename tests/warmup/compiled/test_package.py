"""Compiled packages end to end on the CPU: a first pod exports the declared model and
compiles its package (one C++ compile for the module), stores and shares it; the next
pod restores it on a full hit; a server loads it without importing the compiler and
serves every shape in the declared range, refusing one outside it. A model that cannot
be packaged is served through torch.compile, with the reason kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import write_manifest
from tests.warmup.compiled.models import manifest
from tests.warmup.compiled.test_warm import warm as warm_pod
from warmup.compiled.key import model_key
from warmup.compiled.package import make_package
from warmup.compiled.package_files import FAILED, PACKAGE, PackageFailed
from warmup.core.manifest import parse_manifest

ROOT = Path(__file__).resolve().parents[3]
MLP = manifest(("mlp", "mlp", "{batch: [1, 2, 4], seq: 3}"))

pytestmark = pytest.mark.slow


def warm(root: Path, text: str, monkeypatch: pytest.MonkeyPatch, **extra):
    """A pod's warm as test_warm's, its models served as packages where they can be."""
    return warm_pod(root, text, monkeypatch, **{"models_serve": "auto", **extra})


def serve(root: Path, name: str, *extra: dict, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.warmup.compiled._package_server", name,
         *map(json.dumps, extra)],
        cwd=ROOT,
        env={
            **os.environ,
            "HOME": str(root / "home"),
            "TRITON_WARMUP_WORK_DIR": str(root / "work"),
            "TRITON_WARMUP_MANIFEST": str(root / "manifest.yaml"),
            "TRITON_WARMUP_VOLUME": str(root / "volume"),
            "TRITON_WARMUP_MODELS_SERVE": "auto",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """Pod A packages the model; pod B, at another path on a copy of A's volume, is a
    full hit that restores the package."""
    root = tmp_path_factory.mktemp("packages")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("TRITON_WARMUP_MODELS_SERVE", "auto")
        _, first = warm(root / "a", MLP, monkeypatch)
        (root / "b").mkdir()
        shutil.copytree(root / "a" / "volume", root / "b" / "volume", symlinks=True)
        _, second = warm(root / "b", MLP, monkeypatch)
    return first, second, root / "b"


def test_the_first_pod_packages_the_model_and_compiles_nothing_for_torch_compile(pods):
    first, _, _ = pods
    assert first.ready, first.failures
    [model] = first.models
    assert model.phase == "packaged" and model.package.startswith("made in"), model
    assert model.counts == {} and model.shapes == []  # no torch.compile warm


def test_the_next_pod_restores_the_package_on_a_full_hit(pods):
    _, second, root = pods
    assert second.ready and second.full_hit, second.failures
    [model] = second.models
    assert (model.phase, model.package) == ("packaged", "restored")
    assert (root / "work" / "families" / "packages" / "mlp" / PACKAGE).is_file()


def test_the_server_serves_the_package_without_the_compiler(pods):
    served = serve(pods[2], "mlp", {"batch": 3, "seq": 3}, {"batch": 9, "seq": 3})
    assert served["served_as"] == "package" and served["imported"] == [], served
    *inside, outside = served["calls"]
    assert [c["dims"]["batch"] for c in inside] == [1, 2, 4, 3]  # 3: undeclared, in range
    assert all(c["max_error"] < 1e-4 for c in inside), inside
    assert "batch=9 is outside its package's range 1..4" in outside["refused"]
    assert served["grad"] is False  # under the model's mode, whatever the caller's


def test_models_load_side_by_side_without_the_compiler(pods, tmp_path):
    """Two packaged models (the same code under two names), loaded by Serving.models on
    threads of their own: both served from their packages, nothing compiled."""
    root = tmp_path / "pod"
    shutil.copytree(pods[2], root, symlinks=True)
    packages = root / "work" / "families" / "packages"
    shutil.copytree(packages / "mlp", packages / "mlp2")
    two = manifest(("mlp", "mlp", "{batch: [1, 2, 4], seq: 3}"),
                   ("mlp2", "mlp", "{batch: [1, 2, 4], seq: 3}"))  # fmt: skip
    write_manifest(root / "manifest.yaml", two)
    served = serve(root, "*")
    assert served["served_as"] == {"mlp": "package", "mlp2": "package"}, served
    assert served["imported"] == [] and served["shapes"]["mlp2"] == [1, 3, 16]


def test_a_model_that_does_not_export_gets_the_reason_in_place_of_a_package(tmp_path):
    entry = parse_manifest(manifest(("m", "specialises", "{batch: [1, 2], seq: 3}"))).model("m")
    made = make_package(entry, model_key(entry).digest, torch.device("cpu"), tmp_path)
    assert isinstance(made, PackageFailed) and made.stage == "export", made
    assert (tmp_path / FAILED).is_file() and not (tmp_path / PACKAGE).exists()
    grad = entry.model_copy(update={"mode": "grad"})
    made = make_package(grad, "k", torch.device("cpu"), tmp_path)
    assert isinstance(made, PackageFailed) and "no backward" in made.reason


def test_auto_serves_a_model_that_cannot_be_packaged_through_torch_compile(tmp_path, monkeypatch):
    """A build compiled with another backend: no package, the reason in the run's result
    and in the server, which compiles it (Dynamo's eager backend: no C++ here)."""
    text = manifest(("traced", "traced", "{batch: [1, 2], seq: 3}"))
    _, status = warm(tmp_path, text, monkeypatch)
    assert status.ready, status.failures
    [model] = status.models
    assert model.phase == "warm" and "backend 'eager'" in model.package, model
    served = serve(tmp_path, "traced")
    assert served["served_as"] == "compiled" and "backend 'eager'" in served["package_note"]
    assert all(c["max_error"] == 0.0 for c in served["calls"])


def test_serve_package_without_one_fails_the_model_clearly(tmp_path, monkeypatch):
    text = manifest(("traced", "traced", "{batch: [1, 2], seq: 3}"))
    _, status = warm(tmp_path, text, monkeypatch, models_serve="package")
    [model] = status.models
    assert not status.ready and model.phase == "failed"
    assert model.error.startswith("no package: failed (build)")
    done = subprocess.run(
        [sys.executable, "-m", "tests.warmup.compiled._package_server", "traced"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TRITON_WARMUP_WORK_DIR": str(tmp_path / "work"),
             "TRITON_WARMUP_MANIFEST": str(tmp_path / "manifest.yaml"),
             "TRITON_WARMUP_VOLUME": str(tmp_path / "volume"),
             "TRITON_WARMUP_MODELS_SERVE": "package"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "no usable package: the warmup could not package it (build)" in done.stderr


def test_a_package_that_does_not_load_in_a_fresh_process_is_refused_with_why(tmp_path):
    """The probe's child crashes or fails where a server would: its exit and last line
    come back, and nothing is stored as a package."""
    from warmup.compiled.package_probe import probe

    entry = parse_manifest(MLP).model("mlp")
    broken = tmp_path / PACKAGE
    broken.write_bytes(b"PK\x03\x04 not a package")
    why = probe(broken, entry, {}, torch.device("cpu"))
    assert why.startswith("it does not load in a fresh process (exit 1: "), why
