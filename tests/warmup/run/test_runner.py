"""One rank's warmup (``warmup/run/runner.py``), in this process."""

import json
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from registry import lock
from registry.locks import backend_from_url
from tests.conftest import settings_for
from warmup.core.manifest import Manifest, parse_manifest
from warmup.core.results import RankReport
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run.runner import _kernel_jobs, _placed, warm_rank

USER_MANIFEST = """
version: 1
entries:
  - {kernel: "tests.warmup.user_functions:record_call", dtype: fp32, world_size: 1,
     shapes: [{M: 2, N: 2, K: 2}]}
"""


def _warm_alone(manifest: Manifest, settings: Settings, **options: Any) -> RankReport:
    """:func:`warm_rank` as the only rank of its world, on the CPU, in this process."""
    services = Services(settings, run=True)
    return warm_rank(
        manifest, services, rank=0, world=1, group=None, device=torch.device("cpu"), **options
    )


def test_a_cpu_rank_on_a_gpu_machine_uses_the_cpu_fingerprint(tmp_path: Path, monkeypatch):
    props = SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, total_memory=2**37
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "calls.jsonl"))
    report = _warm_alone(parse_manifest(USER_MANIFEST), settings_for(tmp_path))
    assert report.fingerprint is not None
    assert report.fingerprint["hardware"]["gpu_name"] == "cpu"  # not the H200's
    assert [s.source for s in report.shapes] == ["user"]


def test_a_rank_expands_each_entry_once(tmp_path: Path, monkeypatch):
    # the report's places, the costs and the tasks all read the shapes of one expansion
    from warmup.core.manifest import ManifestEntry

    expanded: list[str] = []
    expand = ManifestEntry.expand

    def counted(entry: ManifestEntry) -> list[dict[str, int]]:
        expanded.append(entry.kernel)
        return expand(entry)

    manifest = parse_manifest(ORDER_MANIFEST)
    monkeypatch.setattr(ManifestEntry, "expand", counted)
    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "calls.jsonl"))
    settings = settings_for(tmp_path)
    report = _warm_alone(manifest, settings)
    assert len(report.shapes) == 6
    assert sorted(expanded) == sorted(e.kernel for e in manifest.entries)


SHARED_MANIFEST = """
version: 1
entries:
  - {kernel: matmul, dtype: fp32, world_size: 1, policy: tune,
     shapes: [{M: 16, N: 16, K: 16}, {M: 32, N: 16, K: 16}]}
  - {kernel: "tests.warmup.user_functions:record_call", dtype: fp32, world_size: 1,
     shapes: [{M: 2, N: 2, K: 2}]}
  - {kernel: matmul, dtype: fp32, world_size: 1, policy: tune, shapes: [{M: 48, N: 16, K: 16}]}
"""


@pytest.mark.slow
def test_user_functions_run_while_another_pod_holds_a_shape_put_aside(tmp_path, monkeypatch):
    # Every kernel entry's shapes in one first pass (the costliest first), then the user
    # functions, then the shapes put aside: the pod works while the other pod finishes,
    # and a user entry between two kernel entries does not make it wait on the first
    # one's held shapes.
    settings = settings_for(tmp_path)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("TEST_USER_LOG", str(calls))
    held = {"M": 32, "N": 16, "K": 16, "dtype": "fp32"}
    holding = threading.Event()

    def other_pod() -> None:  # holds one shape until the user function ran, stores nothing
        backend = backend_from_url(settings.locks.url)
        name = f"tune/matmul/{json.dumps(held, sort_keys=True)}"
        # a ttl the test never reaches: under load, a heartbeat starved for a short ttl
        # would let the pod take the shape over in its first pass
        with lock(name, ttl=600, timeout=5, backend=backend):
            holding.set()
            deadline = time.monotonic() + 60
            while not calls.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    thread = threading.Thread(target=other_pod, daemon=True)
    thread.start()
    assert holding.wait(10)
    order: list[tuple[int, str]] = []
    report = _warm_alone(
        parse_manifest(SHARED_MANIFEST),
        settings,
        progress=lambda done, total, shape: order.append((shape.key["M"], shape.source)),
    )
    thread.join(10)
    assert order == [(48, "tuned"), (16, "tuned"), (2, "user"), (32, "tuned")]
    assert [(s.key["M"], s.error) for s in report.shapes] == [
        (16, None),
        (32, None),
        (2, None),
        (48, None),
    ]  # the report in manifest order


ORDER_MANIFEST = """
version: 1
entries:
  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: [8, 64, 16], N: 8, K: 8}]}
  - {kernel: "tests.warmup.user_functions:record_call", dtype: fp32, world_size: 1,
     shapes: [{M: 2, N: 2, K: 2}]}
  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: 32, N: 8, K: 8}, {M: 16, N: 8, K: 8}]}
"""


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.99])
def test_kernel_shapes_are_taken_costliest_first_across_entries(fraction):
    # A pod that ended on its costliest shape would keep the fleet waiting on it: the
    # first pass takes them by tuning cost, whatever the entries and the pod's rotation.
    entries = _placed(parse_manifest(ORDER_MANIFEST).entries_for(1))
    kernel_entries = [placed for placed in entries if not placed.entry.is_user_function]
    jobs = list(
        _kernel_jobs(kernel_entries, [None, None], fraction, None, torch.device("cpu"))  # type: ignore[list-item]
    )
    taken = [(job.task.key()["M"], job.place) for job in jobs]
    assert [m for m, _ in taken[:3]] == [64, 32, 16]
    assert sorted(taken) == [(8, 0), (16, 2), (16, 5), (32, 4), (64, 1)]  # places kept
    assert {m for m, _ in taken[3:]} == {8, 16}  # 16 (twice) then 8
    assert taken[-1] == (8, 0)
    assert [job.cost for job in jobs] == sorted((job.cost for job in jobs), reverse=True)
    assert jobs[0].cost == 2.0 * 64 * 8 * 8


def test_a_jobs_task_is_made_only_when_the_pass_reaches_it(monkeypatch):
    # inputs and workspaces of every entry made up front would hold them all at once
    from kernels import matmul

    made: list[int] = []
    real = matmul.MatmulAdapter.tasks

    def counting(self, shapes, **kwargs):
        for task in real(self, shapes, **kwargs):
            made.append(task.key()["M"])
            yield task

    monkeypatch.setattr(matmul.MatmulAdapter, "tasks", counting)
    entries = _placed(parse_manifest(ORDER_MANIFEST).entries_for(1))
    kernel_entries = [placed for placed in entries if not placed.entry.is_user_function]
    jobs = _kernel_jobs(kernel_entries, [None, None], 0.0, None, torch.device("cpu"))  # type: ignore[list-item]
    assert made == []
    first = next(jobs)
    assert made == [64] and first.task.key()["M"] == 64
    assert [job.task.key()["M"] for job in jobs] == [32, 16, 16, 8] and len(made) == 5


MODEL_MANIFEST = """
version: 1
models:
  - {name: m, build: "tests.warmup.compiled.models:doubles", world_size: 1,
     dims: {batch: [1, 2]}, inputs: [{shape: [batch, 8], dtype: fp32}]}
"""


def test_a_rank_tells_each_compiled_models_steps_to_model_progress(tmp_path: Path):
    told: list = []
    report = _warm_alone(
        parse_manifest(MODEL_MANIFEST), settings_for(tmp_path), model_progress=told.append
    )
    assert [m.phase for m in report.models] == ["warm"]
    assert [(s.model, s.kind, s.index) for s in told] == [
        ("m", "restore", 0),
        ("m", "build", 0),
        ("m", "shape", 1),
        ("m", "shape", 2),
        ("m", "done", 2),
    ]


BROKEN_MODEL_MANIFEST = """
version: 1
entries:
  - {kernel: matmul, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}
models:
  - {name: broken, build: "tests.warmup.compiled.models:raises", world_size: 1,
     dims: {batch: [1]}, inputs: [{shape: [batch, 8], dtype: fp32}]}
  - {name: fine, build: "tests.warmup.compiled.models:doubles", world_size: 1,
     dims: {batch: [1, 2]}, inputs: [{shape: [batch, 8], dtype: fp32}]}
"""


def test_a_model_that_cannot_be_built_fails_before_any_kernel_shape_is_tuned(
    tmp_path: Path, monkeypatch, caplog
):
    from warmup.compiled import warm

    builds: list[str] = []
    build = warm.build_model

    def counted(model, device):
        builds.append(model.name)
        return build(model, device)

    monkeypatch.setattr(warm, "build_model", counted)
    known: list[bool] = []  # at each kernel shape: whether the broken model's failure was logged

    def kernel_warmed(done, total, shape) -> None:
        known.append(any("model broken failed: " in r.getMessage() for r in caplog.records))

    with caplog.at_level(logging.ERROR, "warmup.compiled.warm"):
        report = _warm_alone(
            parse_manifest(BROKEN_MODEL_MANIFEST), settings_for(tmp_path), progress=kernel_warmed
        )
    assert known == [True]
    assert [(s.source, s.error) for s in report.shapes] == [("tuned", None)]  # the kernels warm
    broken, fine = report.models
    assert broken.failed and "raises(device=...) raised RuntimeError: the weights" in broken.error
    assert not fine.failed and len(fine.shapes) == 2
    assert builds == ["broken", "fine"]  # each built once: the compile used what was built
