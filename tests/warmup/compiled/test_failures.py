"""A model that cannot be built or run fails alone, with a one-line reason: the other
models still warm, readiness names it, nothing stored is lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from registry.core.fingerprint import cpu_fingerprint
from tests.conftest import settings_for
from warmup.cli import main
from warmup.compiled.warm import warm_models
from warmup.core.manifest import ManifestError, parse_manifest
from warmup.core.results import ModelResult, RunStatus
from warmup.core.services import Services

MODELS = "tests.warmup.compiled.models"


def manifest(*builds: str, dims: str = "{batch: [1, 3, 4]}") -> str:
    entries = "".join(
        f"  - name: m{i}\n    build: {build}\n    dims: {dims}\n"
        "    inputs: [{shape: [batch, 8], dtype: fp32}]\n"
        for i, build in enumerate(builds)
    )
    return f"version: 1\nmodels:\n{entries}"


def warm(tmp_path, text: str) -> list[ModelResult]:
    return warm_with(settings_for(tmp_path), text)


def warm_with(settings, text: str, progress=None) -> list[ModelResult]:
    """Every model of ``text`` warmed on one CPU rank; ``progress`` told each step."""
    return list(
        warm_models(
            parse_manifest(text).models,
            Services(settings, run=True),
            rank=0,
            group=None,
            device=torch.device("cpu"),
            fingerprint=cpu_fingerprint(),
            progress=progress,
        )
    )


@pytest.mark.parametrize(
    "build,error",
    [
        (f"{MODELS}:raises", f"{MODELS}:raises(device=...) raised RuntimeError: the weights"),
        (f"{MODELS}:not_callable", "returned int, not a callable"),
        (f"{MODELS}:absent", f"module {MODELS} has no function 'absent'"),
        ("tests.no_such_module:build", "cannot import tests.no_such_module"),
        (f"{MODELS}:no_device", "refuses"),
    ],
)
def test_a_broken_model_fails_alone_with_a_one_line_reason(tmp_path, build, error):
    broken, fine = warm(tmp_path, manifest(build, f"{MODELS}:fails_at_batch_3", dims="{batch: 1}"))
    assert broken.failed and broken.phase == "failed"
    assert error in broken.error and "\n" not in broken.error
    assert not fine.failed and len(fine.shapes) == 1


def test_with_debug_logging_a_failure_shows_where_it_was_raised(tmp_path, caplog):
    caplog.set_level("DEBUG", logger="warmup.compiled.warm")
    built, ran = warm(tmp_path, manifest(f"{MODELS}:raises", f"{MODELS}:fails_at_batch_3"))
    assert built.failed and ran.failed
    tracebacks = [r.exc_info for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 2
    build_error = tracebacks[0][1]
    assert isinstance(build_error.__cause__, RuntimeError)  # the model's own, with its frame
    assert str(tracebacks[1][1]) == "batch 3 is not supported"


def test_the_shapes_before_a_failing_one_are_kept(tmp_path):
    [result] = warm(tmp_path, manifest(f"{MODELS}:fails_at_batch_3"))
    assert result.error == "at {'batch': 3}: ValueError: batch 3 is not supported"
    assert [s["dims"] for s in result.shapes] == [{"batch": 1}]


def test_a_failed_model_keeps_the_pod_unready_and_is_named():
    status = RunStatus(
        state="failed",
        manifest_digest="d",
        started=0.0,
        world_size=1,
        models=[ModelResult(name="m0", phase="failed", error="boom")],
    )
    assert status.failures == ["model m0 (rank 0): boom"]


@pytest.mark.parametrize(
    "text,line",
    [
        (manifest(f"{MODELS}:mlp").replace("m0", "M 0"), "models.0.name: name 'M 0' must be"),
        (manifest("not a function"), "models.0.build: build 'not a function' is not"),
        (manifest(f"{MODELS}:mlp", dims="{batch: 0}"), "models.0.dims: batch=0 must be >= 1"),
        (manifest(f"{MODELS}:mlp", dims="{batch: 1, seq: 2}"), "dims ['seq'] are used by no input"),
        (manifest(f"{MODELS}:mlp", f"{MODELS}:mlp").replace("m1", "m0"), "more than once"),
        (
            manifest(f"{MODELS}:mlp").replace("[batch, 8]", "[batch, width]"),
            "inputs use dimension(s) ['width'] that dims does not declare",
        ),
    ],
)
def test_a_bad_model_entry_is_one_line_naming_the_entry_and_field(text, line):
    with pytest.raises(ManifestError) as info:
        parse_manifest(text)
    assert any(line in error for error in info.value.errors), info.value.errors


def test_validate_imports_each_build_and_exits_2(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(manifest(f"{MODELS}:no_device", "tests.no_such_module:build"))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "models.0.build:" in err and "no_device(device=...)" in err
    assert "models.1.build:" in err and "cannot import tests.no_such_module" in err


def test_a_fleet_compiles_a_model_once_a_waiting_pod_restores_it(tmp_path, monkeypatch):
    """Pod A compiles under the model's fleet lock; pod B, started while A compiles,
    waits for the lock, looks again, restores A's artifacts and compiles nothing."""
    import threading
    import time

    from warmup.compiled import warm as warm_module

    def fake_compile(
        model, built, device, steps, learned, told
    ):  # the cache folder of the calling pod's settings
        folder = Path(os.environ[f"FAKE_CACHE_{threading.current_thread().name}"])
        artifact = folder / "fxgraph" / "entry"
        compiles = 0 if artifact.exists() else 1
        if compiles:
            compiling.set()  # under the fleet lock: B starts now
            time.sleep(0.5)  # a compile: B arrives meanwhile
            artifact.parent.mkdir(parents=True, exist_ok=True)
            artifact.write_bytes(b"graph")
        return ModelResult(name=model.name, phase="warm", counts={"inductor_compiles": compiles})

    monkeypatch.setattr(warm_module, "_compile_and_run", fake_compile)
    [model] = parse_manifest(manifest(f"{MODELS}:mlp", dims="{batch: 1}")).models
    results: dict[str, ModelResult] = {}
    pods = {name: settings_for(tmp_path / name, volume=tmp_path / "volume") for name in "ab"}
    for name, settings in pods.items():
        monkeypatch.setenv(f"FAKE_CACHE_{name}", str(settings.folders.inductor_cache_dir))

    def pod(name: str) -> None:
        [results[name]] = warm_models(
            [model],
            Services(pods[name], run=True),
            rank=0,
            group=None,
            device="cpu",
            fingerprint=cpu_fingerprint(),
        )

    compiling = threading.Event()  # B starts once A compiles: a pod builds before it restores
    first = threading.Thread(target=pod, args=("a",), name="a")
    first.start()
    assert compiling.wait(30)
    second = threading.Thread(target=pod, args=("b",), name="b")
    second.start()
    first.join(30)
    second.join(30)
    assert results["a"].counts["inductor_compiles"] == 1 and results["a"].stored_artifacts == 1
    assert results["b"].restore == "hit" and results["b"].counts["inductor_compiles"] == 0


@pytest.mark.slow
def test_a_model_failing_on_one_rank_fails_on_all_and_the_next_model_warms(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT, free_port

    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.warmup.compiled._ranks", str(tmp_path)],
            cwd=ROOT,
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
        )
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for rank, (uneven, even) in enumerate(ranks):
        assert uneven["phase"] == "failed" and [s["dims"] for s in uneven["shapes"]] == [
            {"batch": 1}
        ]
        expected = "ValueError: rank 1 cannot do batch 3" if rank else "another rank failed it"
        assert expected in uneven["error"]
        assert even["phase"] == "warm" and len(even["shapes"]) == 2


def test_a_restore_that_was_not_whole_is_stored_again(tmp_path, monkeypatch):
    """Blobs gone from the volume: the FX graph may still hit (nothing counted as
    compiled), yet the pod stores again, so the next pod finds them."""
    from registry.caches import inductor_cache
    from warmup.compiled import warm as warm_module

    def fake_compile(model, built, device, steps, learned, told):
        folder = Path(os.environ["FAKE_CACHE"])
        for name in ("graph", "kernel"):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(name.encode())
        return ModelResult(name=model.name, phase="warm", counts={"inductor_compiles": 0})

    monkeypatch.setattr(warm_module, "_compile_and_run", fake_compile)
    [model] = parse_manifest(manifest(f"{MODELS}:mlp", dims="{batch: 1}")).models

    def pod(name: str) -> ModelResult:
        settings = settings_for(tmp_path / name, volume=tmp_path / "volume")
        monkeypatch.setenv("FAKE_CACHE", str(settings.folders.inductor_cache_dir))
        [result] = warm_models(
            [model],
            Services(settings, run=True),
            rank=0,
            group=None,
            device="cpu",
            fingerprint=cpu_fingerprint(),
        )
        return result

    assert pod("a").stored_artifacts == 2  # a miss: stored
    blob = next(p for p in (tmp_path / "volume" / "inductor" / "blobs").rglob("*") if p.is_file())
    blob.unlink()
    second = pod("b")
    assert second.restore == "hit (1 artifacts recompiled)" and second.stored_artifacts == 2
    third = pod("c")
    assert third.restore == "hit" and third.stored_artifacts == 0  # whole again: nothing to do
    assert inductor_cache.file_sha(blob.parent.parent / blob.parent.name / blob.name)
