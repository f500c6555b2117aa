"""``--work-dir`` on every command that reads the pod's work folder: it is the
``work_dir`` setting, and what derives from it (the status file, the caches restored
for the server) follows it, unless set on its own."""

import json
import signal
from pathlib import Path

import pytest

from tests.conftest import DEMO, error_line
from warmup.cli import build_parser, main
from warmup.core.results import RunStatus
from warmup.core.settings import Settings

COMMANDS = ["run", "serve", "status", "doctor", "explain"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_that_reads_the_work_folder_takes_the_option(tmp_path, command):
    args = build_parser(Settings()).parse_args([command, "--work-dir", str(tmp_path)])
    assert args.work_dir == tmp_path


def ready(path):
    RunStatus(state="ready", manifest_digest="d", started=0.0, world_size=1).write(path)


def test_status_reads_the_status_file_of_the_work_folder_given(isolated, capsys):
    other = isolated / "other-work"
    ready(other / "status.json")
    assert main(["status"]) == 2  # TRITON_WARMUP_WORK_DIR's folder holds none
    assert str(isolated / "work_dir" / "status.json") in capsys.readouterr().err
    assert main(["status", "--work-dir", str(other)]) == 0
    assert capsys.readouterr().out.startswith("warmup ready")
    assert main(["status", "--work-dir", str(other), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "ready"


def test_a_status_file_set_on_its_own_stays_where_it_is_set(isolated, capsys, monkeypatch):
    own = isolated / "elsewhere" / "s.json"
    ready(own)
    monkeypatch.setenv("TRITON_WARMUP_STATUS_FILE", str(own))
    assert main(["status", "--work-dir", str(isolated / "other-work")]) == 0


class Started(Exception):
    """Past the checks: the command's own work would start here with these settings."""

    def __init__(self, settings):
        super().__init__("started")
        self.settings = settings


@pytest.mark.parametrize("command", ["run", "serve"])
def test_run_and_serve_work_in_the_folder_given(isolated, capsys, monkeypatch, command):
    (isolated / "volume").mkdir()
    seen = []

    def started(settings, *args):
        seen.append(settings)
        raise Started(settings)

    monkeypatch.setattr("warmup.run.launch.run", started)
    monkeypatch.setattr("warmup.sidecar.server.Sidecar", started)
    work = isolated / "given-work"
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert main([command, "--work-dir", str(work), "--manifest", str(DEMO)]) == 1
    finally:  # serve catches these signals from before its start
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    [settings] = seen
    assert settings.paths.work_dir == work and settings.paths.status_file == work / "status.json"
    assert settings.folders.triton_cache_dir == work / "triton-cache"
    assert settings.folders.inductor_cache_dir == work / "inductor-cache"
    assert settings.paths.metrics_dir == work / "serving-metrics"


def test_doctor_checks_the_folder_given(isolated, capsys):
    work = isolated / "given-work"
    argv = ["doctor", "--device", "cpu", "--only", "cache", "--json", "--work-dir", str(work)]
    assert main(argv) == 0
    rows = {c["name"]: c["detail"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert rows["cache/work-dir"] == f"{work} is writable"
    assert rows["cache/triton"] == f"{work / 'triton-cache'} is writable"
    assert not work.exists()  # a probe leaves nothing behind


def test_explain_reads_the_folder_given(isolated, monkeypatch):
    seen = []

    def explained(settings, args):
        seen.append(settings)
        return 0

    monkeypatch.setattr("warmup.explain.run", explained)
    work = isolated / "given-work"
    assert main(["explain", "--manifest", str(DEMO), "--work-dir", str(work)]) == 0
    paths = seen[0].paths
    assert paths.work_dir == work
    assert seen[0].folders.triton_cache_dir == work / "triton-cache"


def test_a_work_dir_that_cannot_be_made_is_missing_with_its_fix(isolated, capsys):
    blocker = isolated / "a-file"
    blocker.write_text("")
    argv = ["doctor", "--device", "cpu", "--only", "cache", "--work-dir", str(blocker / "w")]
    assert main(argv) == 1  # the doctor says MISSING, with its fix
    assert "TRITON_WARMUP_WORK_DIR" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize("where", ["/proc/nope", "under-a-file"])
def test_a_work_dir_that_cannot_be_made_is_refused_at_start(isolated, capsys, command, where):
    (isolated / "volume").mkdir()
    blocker = isolated / "a-file"
    blocker.write_text("")
    work = blocker / "w" if where == "under-a-file" else Path(where)
    before = sorted(isolated.rglob("*"))
    argv = [command, "--manifest", str(DEMO), "--work-dir", str(work), "--port", "0"]
    assert main(argv[:-2] if command == "run" else argv) == 2  # before any rank or socket
    line = error_line(capsys.readouterr().err)
    assert f"work dir '{work}' cannot be made or written" in line and "--work-dir" in line
    assert sorted(isolated.rglob("*")) == before  # nothing written
