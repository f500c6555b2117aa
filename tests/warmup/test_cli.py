"""``triton-warmup``'s ordinary mistakes: one line each, the right exit code, no traceback."""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from filelock import FileLock

import warmup.run.checks
from tests.conftest import DEMO, ROOT, env_without_interpreter, error_line
from warmup.cli import main


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return error_line(err)


@pytest.fixture
def pod(isolated):
    """``isolated`` with its volume there, as a pod's mount is."""
    (isolated / "volume").mkdir()
    return isolated


@pytest.mark.parametrize(
    "value,allowed", [("0", "greater than or equal to 1"), ("-1", "greater"), ("9", "less")]
)
def test_option_values_are_checked_like_settings(isolated, capsys, value, allowed):
    assert main(["run", "--world-size", value, "--manifest", str(DEMO)]) == 2
    line = one_line_error(capsys)
    assert f"--world-size={int(value)!r}" in line and allowed in line
    assert not (isolated / "work_dir").exists()  # nothing started, nothing written


def test_the_same_value_from_the_environment_names_the_variable(isolated, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_WARMUP_WORLD_SIZE", "0")
    assert main(["status"]) == 2
    assert "TRITON_WARMUP_WORLD_SIZE='0'" in one_line_error(capsys)
    assert main(["validate", str(DEMO)]) == 0  # a file alone: it reads no settings


def test_a_world_size_the_manifest_has_no_entry_for_fails_before_any_rank(pod, capsys):
    assert main(["run", "--world-size", "3", "--manifest", str(DEMO)]) == 2
    err = capsys.readouterr().err
    assert "no entry for world size 3" in err and "entries.0 (ag_gemm, world size 2)" in err
    assert "run with --world-size 2" in err  # the command line's words
    assert not (pod / "work_dir" / "status.json").exists()  # never ready, never written


def test_device_cuda_without_a_gpu_fails_before_any_rank(pod, capsys, monkeypatch):
    monkeypatch.setattr(warmup.run.checks, "GPU_LIST", pod / "no-gpus")
    assert main(["run", "--device", "cuda", "--manifest", str(DEMO)]) == 2
    line = one_line_error(capsys)
    assert "device cuda: 2 rank(s) need 2 GPU(s), this machine has 0" in line
    assert not (pod / "work_dir").exists()


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_volume_that_is_not_there_is_an_error_unless_asked_to_create_it(
    isolated, capsys, monkeypatch, command
):
    missing = isolated / "no" / "vol"
    assert main([command, "--volume", str(missing), "--manifest", str(DEMO)]) == 2
    line = one_line_error(capsys)
    assert f"volume '{missing}' does not exist" in line and "--create-volume" in line
    assert not (isolated / "no").exists() and not (isolated / "work_dir").exists()

    class Asked(Exception):
        """Past the volume check: the command's own work would start here."""

    def started(*args, **kwargs):
        raise Asked

    monkeypatch.setattr("warmup.run.launch.run", started)
    monkeypatch.setattr("warmup.sidecar.server.Sidecar", started)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        for asked in (["--create-volume"], []):
            monkeypatch.setenv("TRITON_WARMUP_CREATE_VOLUME", "false" if asked else "true")
            argv = [command, "--volume", str(missing), *asked, "--manifest", str(DEMO)]
            assert main(argv) == 1 and "Asked" in one_line_error(capsys)
            assert missing.is_dir()
            missing.rmdir()
    finally:  # serve catches these signals from before its start
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_serve_on_a_port_in_use_says_so(pod, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--manifest", str(DEMO), "--host", "127.0.0.1", "--port", str(port)]
        assert main(argv) == 2
    line = one_line_error(capsys)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "TRITON_WARMUP_METRICS_PORT" in line


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_signing_key_others_can_read_stops_run_and_serve_in_one_line(
    pod, capsys, monkeypatch, command
):
    from registry.trust import signing

    private, _ = signing.generate(pod / "keys", "fleet")
    private.chmod(0o644)  # a copy that lost its mode
    monkeypatch.setenv("TRITON_WARMUP_SIGNING_KEY", str(private))
    monkeypatch.setenv("TRITON_WARMUP_ALLOW_UNSIGNED", "true")
    args = ["--manifest", str(DEMO)] + (["--port", "0"] if command == "serve" else [])
    assert main([command, *args]) == 2
    line = one_line_error(capsys)
    assert f"{private} has mode 0644: others can read it; chmod 0600" in line
    assert not (pod / "work_dir" / "status.json").exists()


@pytest.mark.slow
def test_serve_stopped_while_its_start_waits_on_the_store_ends_cleanly(tmp_path):
    # /healthz answers as soon as the sidecar serves; its start then recovers the store,
    # under the store's lock. A stop in that wait ends it now, not at the kubelet's SIGKILL.
    volume = tmp_path / "volume"
    (volume / "registry").mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **env_without_interpreter(),
        "TRITON_WARMUP_VOLUME": str(volume),
        "TRITON_WARMUP_WORK_DIR": str(tmp_path / "work"),
        "TRITON_WARMUP_MANIFEST": str(DEMO),
    }
    command = [sys.executable, "-m", "warmup", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with FileLock(str(volume / "registry" / ".store.lock")):  # another writer holds it
        server = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                        break
                except OSError:
                    assert time.monotonic() < deadline and server.poll() is None
                    time.sleep(0.1)
            time.sleep(0.5)  # into the wait on the lock
            assert server.poll() is None
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=20) == 0, server.stderr.read() if server.stderr else ""
        finally:
            server.kill()
            server.communicate()


@pytest.mark.parametrize(
    "kernel,reason",
    [
        ("no_such_package.mod:warm", "cannot import no_such_package.mod: ModuleNotFoundError"),
        ("tests.warmup.user_functions:takes_positional_only", "which its signature"),
    ],
)
def test_validate_finds_each_user_function_and_checks_its_signature(
    isolated, capsys, kernel, reason
):
    manifest = isolated / "m.yaml"
    manifest.write_text(
        f"version: 1\nentries:\n  - {{kernel: '{kernel}', dtype: fp32, world_size: 1,\n"
        "     shapes: [{M: 1, N: 1, K: 1}]}\n"
    )
    assert main(["validate", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "entries.0.kernel" in err and reason in err and "Traceback" not in err


EVERY_ERROR = """\
version: 1
entries:
  - {kernel: ag_gem, dtype: fp32, world_size: 2, policy: tunee, shapes: [{M: 64, N: 32, K: 32}]}
  - {kernel: ag_gemm, dtype: fp33, world_size: 2, shapes: [{M: [63, 64], N: 32, K: 32}]}
models:
  - {name: mlp, build: 'no_such_module:build', dims: {batch: [1, 8]},
     inputs: [{shape: [batch, 64], dtype: fp32}]}
"""


def test_validate_lists_every_error_of_a_manifest_at_once(isolated, capsys):
    path = isolated / "m.yaml"
    path.write_text(EVERY_ERROR)
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": ")[3] for line in lines] == [
        "entries.0",  # the kernel, not hidden behind the policy of its entry
        "entries.0.policy",
        "entries.1.dtype",
        "entries.1.shapes",  # the kernel's rule, checked beside the entry's other errors
        "models.0.build",
    ]
    text = "\n".join(lines)
    assert "kernel 'ag_gem' is neither" in text and "(got 'tunee')" in text
    assert "ag_gemm rejects 1 shape(s): M=63 is not a multiple of world_size 2" in text
    assert "cannot import no_such_module: ModuleNotFoundError" in text


FRESH_VALIDATE = """
import json, sys
import warmup.program  # the console script's module
from warmup.cli import exit_code, main
codes = [main(["validate", path]) for path in sys.argv[1:]]
heavy = ("torch", "triton", "warmup.demo", "tests.warmup.user_functions", "warmup.core.settings",
         "pydantic_settings")
print(json.dumps({
    "codes": codes,
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in heavy or m in heavy),
}))
"""


def test_validate_imports_neither_torch_nor_triton_nor_the_users_functions(tmp_path):
    user, bad_shape = tmp_path / "user.yaml", tmp_path / "bad_shape.yaml"
    user.write_text(
        "version: 1\nentries:\n  - {kernel: 'tests.warmup.user_functions:record_call',\n"
        "     dtype: fp32, world_size: 1, shapes: [{M: 1, N: 1, K: 1}]}\n"
    )
    bad_shape.write_text(DEMO.read_text().replace("M: 32,", "M: 33,"))
    demo = ROOT / "examples" / "demo.yaml"  # its model's builder: warmup.demo:compiled_mlp
    done = subprocess.run(
        [sys.executable, "-c", FRESH_VALIDATE, str(demo), str(user), str(bad_shape)],
        cwd=ROOT,
        env=env_without_interpreter(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"codes": [0, 0, 2], "imported": []}


def test_run_refuses_a_shape_its_kernel_rejects_before_the_work_folder_exists(pod, capsys):
    manifest = pod / "m.yaml"
    manifest.write_text(
        "version: 1\nentries:\n  - {kernel: ag_gemm, dtype: fp32, world_size: 2,\n"
        "     shapes: [{M: [32, 63], N: 32, K: 32}]}\n"
    )
    assert main(["run", "--manifest", str(manifest)]) == 2
    line = one_line_error(capsys)
    assert "entries.0.shapes: ag_gemm rejects 1 shape(s): M=63 is not a multiple" in line
    assert not (pod / "work_dir").exists()  # no status, no rank, no run folder


def test_validate_prints_what_the_manifest_expands_to(capsys):
    assert main(["validate", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert "ag_gemm fp32, world size 2, policy tune: 3 shape(s)" in out
    assert "  M=32 N=32 K=32" in out and "is valid (digest" in out


def test_validate_lists_each_models_shapes(capsys):
    assert main(["validate", str(ROOT / "examples" / "demo.yaml")]) == 0
    out = capsys.readouterr().out
    assert "model demo-mlp (warmup.demo:compiled_mlp), world size 2: 2 shape(s)" in out
    assert "  batch=1\n  batch=8\n" in out


def test_an_unexpected_error_is_one_line_and_debug_shows_where(isolated, capsys, monkeypatch):
    def broken(args):
        raise TypeError("something internal")

    monkeypatch.setattr("warmup.cli._validate", broken)
    assert main(["validate", str(DEMO)]) == 1
    assert "TypeError: something internal (--debug shows where)" in one_line_error(capsys)
    assert main(["--debug", "validate", str(DEMO)]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_a_broken_install_is_one_line_too(isolated, capsys, monkeypatch):
    # a module the command needs cannot be imported: the error it met is still one line
    monkeypatch.setitem(sys.modules, "warmup.sidecar.probe_server", None)

    def broken(args):
        raise ModuleNotFoundError("No module named 'h11'")

    monkeypatch.setattr("warmup.cli._validate", broken)
    assert main(["validate", str(DEMO)]) == 1
    assert "ModuleNotFoundError: No module named 'h11'" in one_line_error(capsys)


def test_a_user_function_in_the_working_folder_validates_as_the_ranks_import_it(
    isolated, capsys, monkeypatch
):
    import sys

    (isolated / "mywarm.py").write_text("def fn(*, shape, dtype, device):\n    pass\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(isolated))])
    manifest = isolated / "m.yaml"
    manifest.write_text(
        "version: 1\nentries:\n  - {kernel: 'mywarm:fn', dtype: fp32, world_size: 1,\n"
        "     shapes: [{M: 1, N: 1, K: 1}]}\n"
    )
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err
    assert str(isolated) not in sys.path  # put back as it was
    sys.modules.pop("mywarm", None)


BOUND_AT_RUN_TIME = """\
def _make():
    def warm(*, shape, dtype, device):
        pass
    return warm
globals()["late"] = _make()
"""


@pytest.mark.parametrize("where", ["zip", "globals"])
def test_a_function_that_imports_fine_passes_validate_and_runs_early_check(
    pod, capsys, monkeypatch, where
):
    """Only the import can find these (a module in a zip archive is read through its
    loader; a name bound at run time is a note): validation and run's early check pass
    them, and the run's own import checks them."""
    import zipfile

    if where == "zip":
        archive = pod / "user.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("zmod.py", "def warm(*, shape, dtype, device):\n    pass\n")
        monkeypatch.syspath_prepend(str(archive))
        kernel = "zmod:warm"
    else:
        (pod / "gmod.py").write_text(BOUND_AT_RUN_TIME)
        monkeypatch.syspath_prepend(str(pod))
        kernel = "gmod:late"
    manifest = pod / "m.yaml"
    manifest.write_text(
        f"version: 1\nentries:\n  - {{kernel: '{kernel}', dtype: fp32, world_size: 1,\n"
        "     shapes: [{M: 1, N: 1, K: 1}]}\n"
    )
    assert main(["validate", str(manifest)]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert ("not checked without importing it" in err) == (where == "globals")

    class Asked(Exception):
        """Past the early check: the launcher (which imports the function) starts here."""

    def started(*args, **kwargs):
        raise Asked

    monkeypatch.setattr("warmup.run.launch.run", started)
    assert main(["run", "--world-size", "1", "--manifest", str(manifest)]) == 1
    assert "Asked" in one_line_error(capsys)
    assert "zmod" not in sys.modules and "gmod" not in sys.modules


def test_a_remote_tier_url_that_cannot_be_used_fails_before_any_rank(pod, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_WARMUP_REMOTE_URL", "redis://cache:abc/0")
    assert main(["run", "--manifest", str(DEMO)]) == 2
    line = one_line_error(capsys)
    assert "TRITON_WARMUP_REMOTE_URL" in line and "Port could not be cast" in line
    assert not (pod / "work_dir" / "status.json").exists()


def _summarised(**fields) -> str:
    from warmup.cli import summary
    from warmup.core.results import RunStatus

    status = {"state": "ready", "manifest_digest": "d", "started": 1000.0, "world_size": 2}
    return summary(RunStatus(**{**status, **fields}))


def test_the_summary_says_what_its_figures_count():
    # the duration counts from the run's process's start; the benchmark runs are every
    # rank's added up (each rank times the same candidates in lockstep)
    line = _summarised(duration_s=22.4, benchmark_runs=378).splitlines()[0]
    assert line.endswith(
        ", 378 benchmark runs over all ranks, ready 22.4 s after its process started"
    )
    failed = _summarised(state="failed", finished=1003.0)  # ended by an error: no duration
    assert "failed 3.0 s after its process started" in failed


def test_the_summary_of_a_run_still_going_counts_its_seconds_so_far():
    line = _summarised(state="running", started=time.time() - 5.0)
    assert "0.0 s" not in line and " s since its process started, so far" in line
    assert 5.0 <= float(line.split(" s since")[0].rsplit(" ", 1)[-1]) < 60.0


def test_the_summary_of_a_model_says_it_compiled_and_what_it_stored_now():
    from warmup.core.results import ModelResult

    why = "no artifacts of model m are stored"
    compiled = ModelResult(
        name="m",
        phase="warm",
        restore=f"miss: {why}",  # before the compile
        stored_artifacts=26,
        counts={"inductor_compiles": 2},
        shapes=[{"dims": {"batch": 1}}, {"dims": {"batch": 8}}],
    )
    [_, line] = _summarised(models=[compiled, compiled.model_copy(update={"rank": 1})]).splitlines()
    assert line.startswith("  model m: warm (2 shapes, 2 graphs compiled, 0 cache hits) in ")
    assert line.endswith(f"; no artifacts restored ({why}), 26 stored now")
    assert "stored artifacts: miss" not in line
