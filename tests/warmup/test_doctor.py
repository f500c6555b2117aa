"""``triton-warmup doctor``: each check passes on a good host and names the fix on a bad one."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from registry import Store
from registry.core import triton_internals
from registry.core.triton_internals import c_compiler
from tests.conftest import free_port, settings_for
from warmup import doctor
from warmup.core.settings import Settings
from warmup.doctor import Host, Result, check_compiler, diagnose

PATH = os.environ.get("PATH", "/usr/bin:/bin")


@pytest.fixture(autouse=True)
def scratch(tmp_path, monkeypatch):
    """The compiler probe's temp folder goes under tmp_path, to see that it is removed."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def by_name(results: list[Result]) -> dict[str, Result]:
    return {r.name: r for r in results}


def fake_program(folder: Path, name: str, script: str = "exit 0") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def parse(settings: Settings, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="triton-warmup")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor.add_parser(sub, settings)
    return parser.parse_args(["doctor", *argv])


# ---- C compiler and Python headers --------------------------------------------------------


def test_the_compiler_check_builds_a_real_extension_here_and_cleans_up(tmp_path, scratch):
    result = check_compiler(settings_for(tmp_path), Host(env={"PATH": PATH}))
    assert result.state == "OK", result
    assert result.detail.startswith(shutil.which("gcc", path=PATH) or "gcc")
    assert list(scratch.iterdir()) == []
    assert not any(doctor._PROBE in name for name in sys.modules)


def test_cc_naming_a_missing_compiler_is_missing_with_a_fix(tmp_path):
    cc = str(tmp_path / "no-such-cc")
    result = check_compiler(settings_for(tmp_path), Host(env={"CC": cc, "PATH": PATH}))
    assert result.state == "MISSING"
    assert cc in result.detail and "No such file" in result.detail
    assert "CC=" in result.fix and "unset" in result.fix


def test_no_compiler_on_path_is_missing_with_the_packages_to_install(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = check_compiler(settings_for(tmp_path), Host(env={"PATH": str(empty)}))
    assert result.state == "MISSING"
    assert "neither gcc nor clang" in result.detail
    assert "gcc libc6-dev" in result.fix


def test_a_compile_error_shows_its_first_error_line_and_the_headers_fix(tmp_path):
    cc = fake_program(
        tmp_path / "bin",
        "cc",
        "echo 'In file included from probe.c:1:' >&2\n"
        "echo 'probe.c:1:10: fatal error: Python.h: No such file or directory' >&2\nexit 1",
    )
    result = check_compiler(settings_for(tmp_path), Host(env={"CC": str(cc), "PATH": PATH}))
    assert result.state == "MISSING"
    assert result.detail.endswith("probe.c:1:10: fatal error: Python.h: No such file or directory")
    assert f"python{sys.version_info.major}.{sys.version_info.minor}-dev" in result.fix


def test_a_compiler_that_writes_nothing_is_missing(tmp_path):
    cc = fake_program(tmp_path / "bin", "cc")
    result = check_compiler(settings_for(tmp_path), Host(env={"CC": str(cc), "PATH": PATH}))
    assert result.state == "MISSING" and "wrote no" in result.detail


def test_missing_python_headers_are_found_before_compiling(tmp_path, monkeypatch):
    monkeypatch.setattr(triton_internals, "python_includes", lambda: [str(tmp_path)])
    result = check_compiler(settings_for(tmp_path), Host(env={"PATH": PATH}))
    assert result.state == "MISSING" and f"no Python.h in {tmp_path}" in result.detail
    assert "-dev" in result.fix


def test_the_compiler_is_picked_the_way_triton_picks_it(tmp_path, monkeypatch):
    gcc = fake_program(tmp_path / "both", "gcc")
    fake_program(tmp_path / "both", "clang")
    clang = fake_program(tmp_path / "clang-only", "clang")
    cases = [
        {"PATH": str(gcc.parent)},
        {"PATH": str(clang.parent)},
        {"PATH": str(tmp_path / "nothing")},
        {"PATH": str(gcc.parent), "CC": "/opt/cc"},
    ]
    assert [c_compiler(env) for env in cases] == [str(gcc), str(clang), None, "/opt/cc"]
    build = pytest.importorskip("triton.runtime.build")
    if not hasattr(build, "_find_compiler"):
        pytest.skip("this Triton picks the compiler inline in _build (3.4, 3.5)")
    for env in cases:
        monkeypatch.delenv("CC", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        try:
            theirs = build._find_compiler.__wrapped__("c")  # past its per-process cache
        except RuntimeError:
            theirs = None
        assert c_compiler(env) == theirs


def test_python_h_is_where_triton_looks_for_it_here():
    assert (Path(triton_internals.python_includes()[0]) / "Python.h").is_file()


# ---- GPU and driver -----------------------------------------------------------------------


@pytest.fixture
def cpu_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)


def fake_driver(tmp_path: Path, gpus: int) -> Path:
    proc = tmp_path / "nvidia"
    for i in range(gpus):
        (proc / "gpus" / f"0000:{i + 1:02x}:00.0").mkdir(parents=True)
    (proc / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    return proc


def gpu_rows(tmp_path: Path, device: str, proc: Path) -> dict[str, Result]:
    host = Host(env={"PATH": PATH}, nvidia_proc=proc)
    return by_name(diagnose(settings_for(tmp_path, device=device), host, ["gpu"]))


def test_the_gpu_checks_skip_when_the_device_is_cpu(tmp_path):
    rows = gpu_rows(tmp_path, "cpu", fake_driver(tmp_path, 2))
    assert [r.state for r in rows.values()] == ["SKIP", "SKIP"]
    assert list(rows) == ["gpu/driver", "gpu/torch"]


def test_no_gpu_with_device_auto_is_a_skip_that_says_the_cpu_is_used(tmp_path, cpu_torch):
    rows = gpu_rows(tmp_path, "auto", tmp_path / "no-driver")
    assert rows["gpu/driver"].state == rows["gpu/torch"].state == "SKIP"
    assert "CPU interpreter" in rows["gpu/driver"].detail


def test_no_gpu_with_device_cuda_is_missing(tmp_path, cpu_torch):
    rows = gpu_rows(tmp_path, "cuda", tmp_path / "no-driver")
    assert rows["gpu/driver"].state == rows["gpu/torch"].state == "MISSING"
    assert "nvidia.com/gpu" in rows["gpu/driver"].fix
    assert "CPU build" in rows["gpu/torch"].fix


def test_the_driver_lists_gpus_and_its_version(tmp_path, cpu_torch):
    rows = gpu_rows(tmp_path, "auto", fake_driver(tmp_path, 2))
    assert rows["gpu/driver"] == Result("gpu/driver", "OK", "2 NVIDIA GPU(s), driver 570.86.15")
    # GPUs there and a torch that cannot see them: auto would warm on CUDA and fail
    assert rows["gpu/torch"].state == "MISSING"


def test_torch_that_sees_the_gpus_is_ok(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rows = gpu_rows(tmp_path, "cuda", fake_driver(tmp_path, 2))
    assert rows["gpu/torch"].state == "OK" and "2 CUDA device(s)" in rows["gpu/torch"].detail


# ---- folders and the lock backend ---------------------------------------------------------


def test_writable_folders_pass_and_the_probe_leaves_nothing_behind(tmp_path, scratch):
    settings = settings_for(tmp_path, work_dir=tmp_path / "work" / "deep")
    settings.paths.volume.mkdir()  # mounted, nothing on it yet
    rows = by_name(diagnose(settings, Host(), ["cache", "volume", "lock"]))
    assert {name: r.state for name, r in rows.items()} == {
        "cache/triton": "OK",
        "cache/work-dir": "OK",
        "volume": "OK",
        "lock": "OK",
    }
    assert "registry" in rows["volume"].detail and "not created yet" in rows["volume"].detail
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch", "volume"]
    assert list(settings.paths.volume.iterdir()) == []


def test_folders_that_cannot_be_created_are_missing_with_a_fix(tmp_path):
    blocker = tmp_path / "a-file"  # a folder under a regular file fails even for root
    blocker.write_text("")
    settings = settings_for(
        tmp_path,
        triton_cache_dir=blocker / "cache",
        volume=blocker / "volume",
        lock_url=f"file://{blocker}/locks",
    )
    rows = by_name(diagnose(settings, Host(), ["cache", "volume", "lock"]))
    assert [r.state for r in rows.values()] == ["MISSING", "OK", "MISSING", "MISSING"]
    assert "Not a directory" in rows["cache/triton"].detail
    assert "TRITON_WARMUP_TRITON_CACHE_DIR" in rows["cache/triton"].fix
    assert (
        "TRITON_WARMUP_VOLUME" in rows["volume"].fix and "does not exist" in rows["volume"].detail
    )
    assert "TRITON_WARMUP_LOCK_URL" in rows["lock"].fix
    blocker.unlink()
    blocker.mkdir()  # a volume that can be made: still MISSING, a run would refuse it
    assert diagnose(settings, Host(), ["volume"])[0].state == "MISSING"
    assert not (blocker / "volume").exists()
    made = diagnose(settings.updated(create_volume=True), Host(), ["volume"])[0]
    assert made.state == "OK" and "run and serve create it" in made.detail
    assert not (blocker / "volume").exists()  # the probe leaves nothing behind


def test_a_volume_not_there_or_not_named_is_missing_with_its_fix(tmp_path, capsys, monkeypatch):
    from warmup.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRITON_WARMUP_VOLUME", raising=False)
    missing = tmp_path / "nonexistent"
    assert main(["doctor", "--only", "volume", "--volume", str(missing)]) == 1
    out = capsys.readouterr().out
    assert f"volume  MISSING  {missing} does not exist" in out
    assert "--create-volume" in out and "mount the volume there" in out
    assert "is writable" not in out and not missing.exists()
    assert main(["doctor", "--only", "volume"]) == 1  # none named: no demo default
    assert "no volume named" in capsys.readouterr().out and not (tmp_path / "demo-volume").exists()


def test_an_unreadable_registry_is_missing(tmp_path):
    registry = tmp_path / "registry-file"
    registry.write_text("")
    (tmp_path / "volume").mkdir()
    result = doctor.check_volume(settings_for(tmp_path, registry_dir=registry), Host())
    assert result.state == "MISSING" and "TRITON_WARMUP_REGISTRY_DIR" in result.fix


def test_a_readable_registry_is_counted_as_registry_ls_counts_it(
    tmp_path, capsys, make_entry, monkeypatch
):
    from warmup.cli import main

    registry = tmp_path / "volume" / "registry"
    store = Store(registry, create=True)
    store.put(make_entry(m=1024))
    store.put(make_entry(m=1024, median=0.5))  # the same entry again: a new generation
    store.put(make_entry(m=2048))
    assert len(os.listdir(registry)) > 2  # generations, the current link, the lock file
    result = doctor.check_volume(settings_for(tmp_path), Host())
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path / "volume"))
    assert main(["registry", "ls"]) == 0
    listed = capsys.readouterr().out.splitlines()
    counted = next(line for line in listed if line.endswith(f"entries in {registry}"))
    assert counted.startswith("2 entries")
    assert result.state == "OK" and result.detail.endswith("registry: 2 entries")


def test_an_empty_registry_folder_has_no_entries(tmp_path):
    (tmp_path / "volume" / "registry").mkdir(parents=True)
    result = doctor.check_volume(settings_for(tmp_path), Host())
    assert result.state == "OK" and result.detail.endswith("registry: 0 entries")


def test_redis_on_a_closed_port_is_missing_quickly(tmp_path):
    settings = settings_for(tmp_path, lock_url=f"redis://127.0.0.1:{free_port()}/0")
    start = time.monotonic()
    result = doctor.check_lock(settings, Host())
    assert time.monotonic() - start < 3
    assert result.state == "MISSING" and "TRITON_WARMUP_LOCK_URL" in result.fix


def test_redis_without_redis_py_is_missing_with_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis raises ImportError
    settings = settings_for(tmp_path, lock_url="redis://127.0.0.1:6379/0")
    result = doctor.check_lock(settings, Host())
    assert result.state == "MISSING" and result.fix == "pip install 'triton-warmup[redis]'"


@pytest.fixture
def redis_socket(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    sock = tmp_path / "redis.sock"
    args = ["--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [server, *args, "--requirepass", "s3cret", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield sock
    proc.terminate()
    proc.wait(timeout=10)


def test_redis_that_answers_ping_is_ok_and_its_password_is_not_shown(tmp_path, redis_socket):
    good = settings_for(tmp_path, lock_url=f"unix://:s3cret@{redis_socket}")
    result = doctor.check_lock(good, Host())
    assert result.state == "OK" and "PING" in result.detail and "s3cret" not in result.detail
    bad = settings_for(tmp_path, lock_url=f"unix://:wrong@{redis_socket}")
    result = doctor.check_lock(bad, Host())
    assert result.state == "MISSING" and "wrong" not in result.detail


# ---- trust --------------------------------------------------------------------------------


def test_the_trust_check_names_the_mode_and_the_key_it_signs_with(tmp_path):
    from registry.trust import signing

    shown = doctor.check_trust(settings_for(tmp_path, allow_unsigned=False), Host())
    assert (shown.state, shown.detail.split(":")[0]) == ("OK", "code-refused")
    assert "TRITON_WARMUP_TRUSTED_KEYS" in shown.detail
    opted = doctor.check_trust(settings_for(tmp_path, allow_unsigned=True), Host())
    assert opted.detail.startswith("unsigned-allowed: ") and "ALLOW_UNSIGNED=true" in opted.detail
    private, _ = signing.generate(tmp_path / "keys", "fleet")
    key = signing.SigningKey.load(private)
    signed = settings_for(tmp_path, trusted_keys=tmp_path / "keys", signing_key=private)
    shown = doctor.check_trust(signed, Host())
    assert shown.detail.startswith("signed: ") and shown.detail.endswith(key.key_id)
    private.chmod(0o644)
    loose = doctor.check_trust(signed, Host())
    assert loose.state == "MISSING" and "others can read it" in loose.detail
    assert "TRITON_WARMUP_SIGNING_KEY" in loose.fix


# ---- the command --------------------------------------------------------------------------


def test_run_prints_a_table_with_fixes_and_exits_1_on_a_miss(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings = settings_for(tmp_path, triton_cache_dir=blocker / "cache")
    settings.paths.volume.mkdir()
    assert doctor.run(settings, parse(settings, "--only", "cache", "--only", "volume")) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CHECK", "STATE", "DETAIL"]
    assert lines[1].split()[:2] == ["cache/triton", "MISSING"]
    assert lines[2].split()[0] == "fix:"
    assert [line.split()[0] for line in lines[3:5]] == ["cache/work-dir", "volume"]
    assert lines[-1] == "2 OK, 0 SKIP, 1 MISSING"


def test_run_prints_json_and_exits_0_when_nothing_is_missing(tmp_path, capsys):
    settings = settings_for(tmp_path)
    assert doctor.run(settings, parse(settings, "--only", "compiler", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert [(c["name"], c["state"]) for c in report["checks"]] == [("compiler", "OK")]


def test_command_line_options_override_the_settings(tmp_path, capsys, monkeypatch):
    from warmup.cli import main

    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path / "volume"))
    monkeypatch.setenv("TRITON_WARMUP_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("TRITON_WARMUP_DEVICE", "cuda")  # the option's cpu wins
    (tmp_path / "other").mkdir()
    args = ["doctor", "--device", "cpu", "--volume", str(tmp_path / "other"), "--json"]
    assert main(args) == 0
    rows = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert rows["gpu/driver"]["state"] == "SKIP"
    assert str(tmp_path / "other") in rows["volume"]["detail"]
    assert list(rows) == [
        "gpu/driver",
        "gpu/torch",
        "compiler",
        "cache/triton",
        "cache/work-dir",
        "volume",
        "lock",
        "trust",
    ]


def test_unknown_checks_are_refused(tmp_path):
    settings = settings_for(tmp_path)
    with pytest.raises(SystemExit):
        parse(settings, "--only", "gpus")
    with pytest.raises(ValueError, match="unknown checks"):
        diagnose(settings, Host(), ["gpus"])


def test_leases_on_a_volume_that_is_not_there_are_skipped_not_ok(tmp_path):
    settings = settings_for(tmp_path, volume=tmp_path / "nonexistent")
    rows = by_name(diagnose(settings, Host(), ["volume", "lock"]))
    assert rows["volume"].state == "MISSING"
    assert rows["lock"].state == "SKIP" and "no volume there" in rows["lock"].detail
    assert not (tmp_path / "nonexistent").exists()  # the lock's probe made nothing
    (tmp_path / "nonexistent").mkdir()
    assert by_name(diagnose(settings, Host(), ["lock"]))["lock"].state == "OK"
