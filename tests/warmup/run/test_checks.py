"""The checks before a run: one sequence, in one order, for the launcher, a torchrun rank
and ``warmup.warm()``; each caller's errors in its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

import warmup
from registry import RegistryError
from registry.core.volume import MissingFolder
from tests.conftest import DEMO, settings_for, write_manifest
from warmup.cli import main as cli_main
from warmup.core.manifest import ManifestError, load_manifest
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run import checks, session
from warmup.run.checks import Caller, RunError, checked, listed_device, lock_backend

MANIFEST = """
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}
"""
NOBODY = "redis://127.0.0.1:1/0"  # port 1: connection refused at once

# Every step of the checks fails for it: world 1 has a function that is not there, and an
# entry for world 2 is refused.
EVERY_STEP_FAILS = """
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 1, shapes: [{M: 16, N: 16, K: 16}]}
  - {kernel: "tests.warmup.user_functions:not_there", dtype: fp32, world_size: 1,
     shapes: [{M: 1, N: 1, K: 1}]}
  - {kernel: ag_gemm, dtype: fp32, world_size: 2, shapes: [{M: 32, N: 32, K: 32}]}
"""


def test_the_checks_fail_in_one_order_each_fix_reaching_the_next(tmp_path, monkeypatch):
    manifest = load_manifest(write_manifest(tmp_path / "m.yaml", EVERY_STEP_FAILS))
    settings = settings_for(tmp_path, lock_url=NOBODY, other_world_sizes="fail")
    devices: list[str] = []

    def no_device(settings: Settings, world: int) -> checks.Device:
        if not devices:
            raise RunError("the device step")
        return "cpu"

    def unusable(self: Services) -> None:
        raise RegistryError("no tier here")

    monkeypatch.setattr(Services, "remote", property(unusable))
    caller = Caller("m.yaml", no_device, volume_fix="make the volume")
    with pytest.raises(MissingFolder, match="make the volume"):  # 1. the volume
        checked(Services(settings, run=True), manifest, 3, caller)
    settings.paths.volume.mkdir()
    with pytest.raises(ManifestError, match="no entry for world size 3"):  # 2. the world
        checked(Services(settings, run=True), manifest, 3, caller)
    with pytest.raises(ManifestError, match="other_world_sizes is 'fail'"):  # 3. the others
        checked(Services(settings, run=True), manifest, 1, caller)
    settings = settings.updated(other_world_sizes="degraded")
    with pytest.raises(RunError, match="the device step"):  # 4. the device
        checked(Services(settings, run=True), manifest, 1, caller)
    devices.append("cpu")
    with pytest.raises(ManifestError, match=r"entries.1.kernel: .*not_there"):  # 5. kernels
        checked(Services(settings, run=True), manifest, 1, caller)
    later = Caller("m.yaml", no_device, volume_fix=None, kernels_later=True)  # the launcher's
    with pytest.raises(RunError, match="TRITON_WARMUP_REMOTE_URL: no tier here"):  # 6. remote
        checked(Services(settings, run=True), manifest, 1, later)
    monkeypatch.undo()
    with pytest.raises(RunError, match="unreachable"):  # 7. the lock server
        checked(Services(settings, run=True), manifest, 1, later)
    fallback = settings.updated(lock_fallback="file")
    done = checked(Services(fallback, run=True), manifest, 1, later)
    assert done.device == "cpu" and done.settings.locks.url == str(settings.paths.layout.locks)


def test_no_entry_for_the_world_and_no_volume_fail_first_on_the_volume_everywhere(
    isolated, capsys, torchrun_rank
):
    """The same first error from ``triton-warmup run``, a torchrun rank and ``warm()``:
    the volume, each in its caller's words; with the volume there, the world size."""
    settings = settings_for(isolated / "pod")  # DEMO: entries for 2 ranks, not 1 or 3
    run = [
        "run",
        "--world-size",
        "3",
        "--manifest",
        str(DEMO),
        "--volume",
        str(settings.paths.volume),
    ]
    torchrun_rank(settings, 1)
    missing = f"volume '{settings.paths.volume}' does not exist"

    assert cli_main(run) == 2
    assert missing in capsys.readouterr().err
    assert session.main() == 2
    assert missing in capsys.readouterr().err
    with pytest.raises(MissingFolder, match=missing):
        warmup.warm(DEMO, settings)

    settings.paths.volume.mkdir(parents=True)
    assert cli_main(run) == 2
    assert "no entry for world size 3" in capsys.readouterr().err
    assert session.main() == 2
    assert "no entry for world size 1" in capsys.readouterr().err
    with pytest.raises(ManifestError, match="no entry for world size 1"):
        warmup.warm(DEMO, settings)
    assert not settings.paths.work_dir.exists()  # nothing written by any of them


def test_the_launcher_counts_the_gpus_the_driver_lists(tmp_path, monkeypatch):
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(checks, "GPU_LIST", gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cuda = settings_for(tmp_path, device="cuda")
    assert listed_device(cuda, 1) == "cuda"
    with pytest.raises(RunError, match=r"need 2 GPU\(s\), this machine has 1 .* or --world-size 1"):
        listed_device(cuda, 2)
    assert listed_device(settings_for(tmp_path, device="auto"), 1) == "cuda"
    monkeypatch.setattr(checks, "GPU_LIST", tmp_path / "no-driver")
    assert listed_device(settings_for(tmp_path, device="auto"), 1) == "cpu"


def test_a_lock_server_that_does_not_answer_is_one_clear_error_or_a_fallback(tmp_path):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    settings = settings_for(tmp_path, manifest=manifest, lock_url=NOBODY)
    with pytest.raises(RunError, match=r"lock server redis://127.0.0.1:1/0 unreachable"):
        lock_backend(Services(settings, run=True), load_manifest(manifest), 1)
    fallback = settings.updated(lock_fallback="file")
    chosen = lock_backend(Services(fallback, run=True), load_manifest(manifest), 1)
    assert chosen.settings.locks.url == str(settings.paths.layout.locks)
    assert (
        chosen.settings.remote.url == "off"
    )  # the tier that followed the lock server goes with it
    given = settings_for(
        tmp_path, manifest=manifest, lock_url=NOBODY, remote_url=NOBODY, lock_fallback="file"
    )
    assert (
        lock_backend(Services(given, run=True), load_manifest(manifest), 1).settings.remote.url
        == NOBODY
    )  # as given


def test_warm_in_process_checks_the_lock_server_before_warming(tmp_path):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    settings = settings_for(tmp_path, manifest=manifest, lock_url=NOBODY, create_volume=True)
    with pytest.raises(RunError, match="unreachable"):  # once: each shape waited its timeout
        warmup.warm(manifest, settings)
    assert not settings.paths.status_file.exists()


def test_warm_and_a_torchrun_rank_make_no_volume_nobody_asked_for(tmp_path, capsys, torchrun_rank):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    settings = settings_for(tmp_path, manifest=manifest)
    with pytest.raises(MissingFolder, match=r"pass Settings\(create_volume=True\)") as info:
        warmup.warm(manifest, settings)
    assert "--create-volume" not in str(info.value)  # a Python caller's words, not a flag
    assert not settings.paths.volume.exists() and not settings.paths.work_dir.exists()
    torchrun_rank(settings, 1)
    assert session.main() == 2
    err = capsys.readouterr().err
    assert "volume" in err and "TRITON_WARMUP_CREATE_VOLUME=true" in err
    assert not settings.paths.volume.exists() and not settings.paths.work_dir.exists()


def test_warm_in_process_on_another_world_size_warms_nothing_and_says_so(tmp_path: Path):
    settings = settings_for(tmp_path, create_volume=True)
    with pytest.raises(ManifestError, match="no entry for world size 1") as info:
        warmup.warm(DEMO, settings)
    assert not settings.paths.status_file.exists()
    # the fix in a Python caller's words: its process group's size, not a flag
    assert "process group of world_size=2" in str(info.value)
    assert "--world-size" not in str(info.value)
