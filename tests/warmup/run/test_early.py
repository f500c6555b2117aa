"""Rank processes started before the launcher has read its settings (``warmup.run.early``):
the run's first ranks, the rest ended; all ended on bad input, and gone when the launcher
is."""

import signal
import subprocess
import sys
import time

import pytest

import warmup.program
import warmup.run.launch
from tests.conftest import ROOT, env_without_interpreter, run_program, settings_for, write_manifest
from warmup.core import logs
from warmup.core.manifest import ManifestError, load_manifest
from warmup.core.results import RunStatus
from warmup.run.early import EarlyRanks
from warmup.run.launch import run

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    # Early ranks inherit this process's environment: without the switch, they run the
    # interpreter only because the launcher's line says so, as on a pod.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


ONE_SHAPE = """version: 1
entries:
  - kernel: ag_gemm
    dtype: fp32
    world_size: 2
    policy: fallback
    shapes: [{M: 32, N: 32, K: 32}]
"""


def _manifest(tmp_path):
    return load_manifest(write_manifest(tmp_path / "manifest.yaml", ONE_SHAPE))


def _ended(early_procs):
    return all(p.poll() is not None for p in early_procs)


def _settings(tmp_path, **extra):
    return settings_for(tmp_path, manifest=tmp_path / "manifest.yaml", **extra)


def test_early_ranks_become_the_run_s_ranks(tmp_path):
    early = EarlyRanks.start(2)
    procs = list(early.procs)
    status = run(_settings(tmp_path), _manifest(tmp_path), early)
    assert status.ready, status.failures
    assert sorted({s.rank for s in status.shapes}) == [0, 1]
    assert [p.returncode for p in procs] == [0, 0]  # they ran the shapes, and ended
    # the launcher's own share ends where it started them, not where it handed over
    assert status.phases["imports"] == pytest.approx(early.started_s, abs=1e-3)
    assert status.phases["rendezvous"] >= 0 and status.phases["rank_start"] > 0


def test_early_ranks_beyond_the_run_s_are_ended_and_the_others_used(tmp_path):
    early = EarlyRanks.start(3)  # 3 GPUs, a pod of 2 ranks
    procs = list(early.procs)
    status = run(_settings(tmp_path), _manifest(tmp_path), early)
    assert status.ready, status.failures
    assert [p.returncode for p in procs[:2]] == [0, 0]  # they ran the shapes
    assert procs[2].returncode not in (None, 0)  # killed, never used
    assert status.phases["imports"] == pytest.approx(early.started_s, abs=1e-3)


def test_fewer_early_ranks_than_the_run_s_are_used_and_the_rest_started(tmp_path):
    early = EarlyRanks.start(1)  # a CPU run of 2 ranks on a machine with 1 GPU
    (proc,) = early.procs
    time.sleep(0.2)  # the launcher's age is counted in clock ticks
    status = run(_settings(tmp_path), _manifest(tmp_path), early)
    assert status.ready, status.failures
    assert sorted({s.rank for s in status.shapes}) == [0, 1]
    assert proc.returncode == 0
    assert status.phases["imports"] >= early.started_s + 0.15  # until rank 1 started


def test_a_rank_that_cannot_be_started_ends_those_started_and_fails_the_status(
    tmp_path, monkeypatch
):
    early = EarlyRanks.start(1)
    (proc,) = early.procs

    def no_process(*args, **kwargs):
        raise BlockingIOError("fork: resource temporarily unavailable")

    monkeypatch.setattr(warmup.run.launch.subprocess, "Popen", no_process)
    settings = _settings(tmp_path)
    with pytest.raises(BlockingIOError):
        run(settings, _manifest(tmp_path), early)
    assert proc.returncode not in (None, 0)  # rank 0 would wait for rank 1 until its limit
    status = RunStatus.read(settings.paths.status_file)
    assert status.state == "failed" and "BlockingIOError" in status.errors[0]


def test_bad_input_ends_the_early_ranks_before_any_rank_runs(tmp_path):
    early = EarlyRanks.start(2)
    procs = list(early.procs)
    with pytest.raises(ManifestError, match="no entry for world size 4"):
        run(_settings(tmp_path, world_size=4), _manifest(tmp_path), early)
    assert _ended(procs)
    assert not (tmp_path / "work" / "run").exists()


def test_an_early_rank_that_died_while_importing_is_replaced(tmp_path):
    early = EarlyRanks.start(2)
    dead = early.procs[1]
    dead.kill()
    dead.wait()
    status = run(_settings(tmp_path), _manifest(tmp_path), early)
    assert status.ready, status.failures
    assert sorted({s.rank for s in status.shapes}) == [0, 1]


def test_a_rank_that_cannot_be_told_its_environment_is_killed_not_left_waiting():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.PIPE
    )
    assert proc.stdin is not None
    proc.stdin.close()  # its input can take no line
    (handed,) = EarlyRanks([proc], 0.0).hand_over([{"RANK": "0"}])
    assert handed is proc
    assert handed.wait(timeout=30) == -signal.SIGKILL  # a failed rank the launcher sees


def test_the_program_hands_the_ranks_it_started_to_the_run(tmp_path, monkeypatch):
    # a machine with 2 GPUs, as the program sees it; the run itself on CPU
    monkeypatch.setattr(warmup.program, "visible_gpus", lambda: 2)
    handed = []
    hand_over = EarlyRanks.hand_over

    def spy(self, envs):
        handed.extend(hand_over(self, envs))
        return handed

    monkeypatch.setattr(EarlyRanks, "hand_over", spy)
    monkeypatch.setattr(logs, "exit_now", sys.exit)  # this process is the test's
    manifest = write_manifest(tmp_path / "manifest.yaml", ONE_SHAPE)
    monkeypatch.setenv("TRITON_WARMUP_WORK_DIR", str(tmp_path / "work"))
    argv = ["run", "--device", "cpu", "--manifest", str(manifest), "--volume", str(tmp_path / "v")]
    argv.append("--create-volume")
    monkeypatch.setattr(sys, "argv", ["triton-warmup", *argv])
    with pytest.raises(SystemExit) as ended:
        warmup.program.entry()
    assert ended.value.code == 0
    assert len(handed) == 2 and [p.returncode for p in handed] == [0, 0]
    status = RunStatus.read(tmp_path / "work" / "status.json")
    assert status.ready and sorted({s.rank for s in status.shapes}) == [0, 1]


@pytest.mark.parametrize("sent", [b"", b"\n"], ids=["launcher-gone", "empty-line"])
def test_an_early_rank_with_no_go_ends_quietly(sent):
    done = subprocess.run(
        [sys.executable, "-m", "warmup.run.early"],
        input=sent,  # then its stdin ends, as when the launcher is gone
        capture_output=True,
        timeout=120,
        env=env_without_interpreter(),
        cwd=ROOT,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


def test_nothing_an_early_rank_imports_before_its_go_reads_triton_s_environment():
    # Triton reads its cache folder and the interpreter switch from the environment the
    # launcher sends; an early rank must not have imported it by then.
    code = (
        "import sys, torch.distributed; from warmup.run import early, session; "
        "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_without_interpreter(),
        cwd=ROOT,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_the_program_starts_no_early_rank_on_a_machine_without_gpus(tmp_path):
    # CI has no GPU: `triton-warmup run` goes the way it always went, and ends with the
    # run's code once its summary is out.
    env = {
        "TRITON_WARMUP_VOLUME": str(tmp_path / "volume"),
        "TRITON_WARMUP_CREATE_VOLUME": "true",
        "TRITON_WARMUP_WORK_DIR": str(tmp_path / "work"),
        "TRITON_WARMUP_MANIFEST": str(write_manifest(tmp_path / "m.yaml", ONE_SHAPE)),
    }
    done = run_program("run", "--device", "cpu", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("warmup ready: 1 kernel shape for 2 ranks (1 on the kernel's default")
