"""One rank's warmup (``warmup/run/runner.py``), in this process."""

from pathlib import Path
from types import SimpleNamespace

import torch

from tests.conftest import settings_for
from warmup.manifest import parse_manifest
from warmup.run.runner import warm_rank

USER_MANIFEST = """
version: 1
entries:
  - {kernel: "tests.warmup.user_functions:record_call", dtype: fp32, world_size: 1,
     shapes: [{M: 2, N: 2, K: 2}]}
"""


def test_a_cpu_rank_on_a_gpu_machine_uses_the_cpu_fingerprint(tmp_path: Path, monkeypatch):
    props = SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, total_memory=2**37
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "calls.jsonl"))
    report = warm_rank(
        parse_manifest(USER_MANIFEST),
        settings_for(tmp_path),
        rank=0,
        world=1,
        group=None,
        device=torch.device("cpu"),
    )
    assert report.fingerprint is not None
    assert report.fingerprint["hardware"]["gpu_name"] == "cpu"  # not the H200's
    assert [s.source for s in report.shapes] == ["user"]
