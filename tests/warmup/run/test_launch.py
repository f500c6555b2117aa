"""``triton-warmup run`` end to end on CPU: 2 ranks on gloo, the interpreter."""

import io
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import warmup
import warmup.run.launch
from registry import Store
from tests.conftest import (
    DEMO,
    ROOT,
    env_without_interpreter,
    run_program,
    run_python,
    settings_for,
    write_manifest,
)
from warmup.cli import main
from warmup.core.manifest import ManifestError, load_manifest
from warmup.core.results import RunStatus, ShapeResult
from warmup.run.launch import _wait, run
from warmup.run.runner import progress_printer

pytestmark = pytest.mark.slow


def samples(path: Path) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


USER = "tests.warmup.user_functions:"


def entry(
    kernel: str, world: int, shape: str = "{M: 32, N: 32, K: 32}", dtype: str = "fp32"
) -> str:
    """One manifest entry, a YAML flow mapping: ``kernel`` at one shape (or a range of M)."""
    return f'{{kernel: "{kernel}", dtype: {dtype}, world_size: {world}, shapes: [{shape}]}}'


def manifest_of(tmp_path: Path, *entries: str, name: str = "m.yaml") -> Path:
    """A valid manifest of ``entries`` at ``tmp_path / name``."""
    lines = "".join(f"  - {e}\n" for e in entries)
    return write_manifest(tmp_path / name, f"version: 1\nentries:\n{lines}")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    settings = settings_for(root)
    manifest = load_manifest(DEMO)
    first = run(settings, manifest)
    first_metrics = samples(settings.paths.run_metrics_file)
    second = run(settings.updated(full_hit_exit=False), manifest)  # the ranks' own lookups
    return settings, first, first_metrics, second


def test_first_run_tunes_every_miss_and_stores_it(two_runs):
    settings, first, metrics, _ = two_runs
    assert first.state == "ready" and first.failures == []
    assert first.sources == {"tuned": 6} and first.benchmark_runs > 0
    entries = Store(settings.paths.layout.registry).entries()
    assert sorted((e.key["M"], e.key["N"], e.key["K"]) for e in entries) == [
        (32, 32, 32),
        (48, 40, 64),
        (64, 48, 32),
    ]
    assert {e.key["world"] for e in entries} == {2}
    assert (
        metrics[("triton_warmup_configs_total", (("kernel", "ag_gemm"), ("source", "tuned")))] == 6
    )
    assert metrics[("triton_warmup_tuning_seconds_count", (("kernel", "ag_gemm"),))] == 6


def test_second_run_hits_everything_and_tunes_nothing(two_runs):
    *_, second = two_runs
    assert second.state == "ready" and second.sources == {"registry": 6}
    assert second.benchmark_runs == 0
    assert sorted({row.rank for row in second.shapes}) == [0, 1]
    assert all(row.compile_seconds is not None for row in second.shapes)


def test_metrics_sum_every_rank(two_runs):
    settings, *_ = two_runs
    metrics = samples(settings.paths.run_metrics_file)
    hits = (("kernel", "ag_gemm"), ("source", "registry"))
    assert metrics[("triton_warmup_cache_hits_total", hits)] == 6  # 3 shapes x 2 ranks
    assert metrics[("triton_warmup_ranks", ())] == 2
    assert metrics[("triton_warmup_compile_seconds_count", (("kernel", "ag_gemm"),))] == 6
    assert metrics[("triton_warmup_warmup_duration_seconds", ())] > 0


def test_the_run_predicts_each_family_before_it_warms(two_runs):
    settings, _, first_metrics, _ = two_runs
    metrics = samples(settings.paths.run_metrics_file)

    def outcome(found, family):
        labels = [lb for (name, lb), v in found.items() if name == "triton_warmup_cache_prediction"]
        return {dict(lb)["outcome"] for lb in labels if dict(lb)["family"] == family and found[
            ("triton_warmup_cache_prediction", lb)] == 1}  # fmt: skip

    assert outcome(first_metrics, "tuned-configs") == {"empty"}  # the volume was empty
    assert outcome(metrics, "tuned-configs") == {"hit"}  # what the first run stored
    assert outcome(metrics, "triton-kernels") == {"empty"}  # the CPU compiles nothing


def test_status_file_is_the_summary(two_runs):
    settings, *_, second = two_runs
    assert RunStatus.read(settings.paths.status_file) == second
    on_disk = json.loads(settings.paths.status_file.read_text())
    assert on_disk["manifest_digest"] == load_manifest(DEMO).digest()
    assert on_disk["fingerprint"]["hardware"]["gpu_name"] == "cpu"
    assert on_disk["sources"] == {"registry": 6} and on_disk["failures"] == []


def test_the_status_accounts_for_the_launcher_and_the_ranks_exit(two_runs):
    *_, second = two_runs
    phases = second.phases
    assert {"imports", "rank_start", "rendezvous", "prepare", "exit", "save"} <= set(phases)
    assert all(seconds >= 0 for seconds in phases.values())
    assert 0 < phases["imports"] < second.duration_s and phases["exit"] < second.duration_s


def test_the_program_prints_its_summary_and_ends_with_the_run_s_code(two_runs):
    # ``triton-warmup run`` ends without Python's teardown: what it printed must be out.
    settings, *_ = two_runs
    env = {
        "TRITON_WARMUP_VOLUME": str(settings.paths.volume),
        "TRITON_WARMUP_WORK_DIR": str(settings.paths.work_dir.parent / "program"),
        "TRITON_WARMUP_MANIFEST": str(DEMO),
        "TRITON_WARMUP_DEVICE": "cpu",
    }
    started = time.time()
    done = run_program("run", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("warmup ready: 3 kernel shapes for 2 ranks (3 found in the registry)")
    status = RunStatus.read(settings.paths.work_dir.parent / "program" / "status.json")
    assert status is not None and status.ready and status.sources == {"registry": 6}
    assert status.started <= started + 1 and status.phases["exit"] >= 0


def test_a_bad_manifest_exits_2_before_writing_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nentries:\n  - kernel: ag_gemm\n    dtype: int8\n")
    argv = ["run", "--manifest", str(bad), "--volume", str(tmp_path / "v")]
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert "entries.0.dtype" in err and "entries.0.world_size: Field required" in err
    assert list(tmp_path.iterdir()) == [bad]  # no work dir, no volume, no status


def test_a_killed_rank_fails_the_run_and_leaves_a_usable_registry(tmp_path):
    die = entry(USER + "die_on_rank_1", 2, "{M: 1, N: 1, K: 1}")
    manifest = manifest_of(tmp_path, entry("ag_gemm", 2), die)
    settings = settings_for(tmp_path, manifest=manifest, rank_timeout_s=20)
    status = run(settings, load_manifest(manifest))
    assert status.state == "failed"
    assert any("rank 1 exited with code -9" in f for f in status.failures)
    store = Store(settings.paths.layout.registry, create=True)
    assert len(store) == 1 and store.quarantined == 0  # what was tuned before the kill stays
    retry = manifest_of(tmp_path, entry("ag_gemm", 2), name="retry.yaml")
    again = run(settings.updated(manifest=retry), load_manifest(retry))
    assert again.state == "ready" and again.sources == {"registry": 2}


def test_user_functions_are_called_per_shape_and_their_errors_reported(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("TEST_USER_LOG", str(log))
    for given_as_options in ("TRITON_WARMUP_MANIFEST", "TRITON_WARMUP_VOLUME"):
        monkeypatch.delenv(given_as_options, raising=False)
    record = entry(USER + "record_call", 2, "{M: {pow2: [1, 4]}, N: 8, K: 8}", dtype="bf16")
    manifest = manifest_of(tmp_path, record, entry(USER + "raise_error", 2, "{M: 2, N: 2, K: 2}"))
    settings = settings_for(tmp_path, manifest=manifest)
    status = run(settings, load_manifest(manifest))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # a rank's code that makes Serving() from the environment finds this run's paths
    assert {(c["manifest"], c["volume"]) for c in calls} == {
        (str(manifest.resolve()), str(settings.paths.volume.resolve()))
    }
    assert sorted((c["rank"], c["shape"]["M"]) for c in calls) == [
        (r, m) for r in (0, 1) for m in (1, 2, 4)
    ]
    assert {c["dtype"] for c in calls} == {"torch.bfloat16"}
    assert status.state == "failed"
    assert sum("no kernel for" in f for f in status.failures) == 2  # one per rank


def test_warm_in_process_primes_this_process(tmp_path):
    manifest = manifest_of(tmp_path, entry("ag_gemm", 1, "{M: 16, N: 16, K: 16}"))
    settings = settings_for(tmp_path, manifest=manifest, create_volume=True)
    first = warmup.warm(manifest, settings)
    second = warmup.warm(load_manifest(manifest), settings)
    assert first.sources == {"tuned": 1} and second.sources == {"registry": 1}
    shutil.rmtree(settings.paths.work_dir)


def test_joining_a_torchrun_environment(tmp_path):
    env = {
        **env_without_interpreter(),  # the session turns it on for a CPU run itself
        "TRITON_WARMUP_VOLUME": str(tmp_path / "v"),
        "TRITON_WARMUP_CREATE_VOLUME": "true",
        "TRITON_WARMUP_WORK_DIR": str(tmp_path / "w"),
        "TRITON_WARMUP_MANIFEST": str(DEMO),
        "TRITON_WARMUP_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),  # torchrun leaves its log folder there
    }
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    done = run_python(*torchrun, "-m", "warmup.run.session", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads((tmp_path / "w" / "status.json").read_text())
    assert status["state"] == "ready" and status["sources"] == {"tuned": 6}
    assert samples(tmp_path / "w" / "metrics.prom")[("triton_warmup_ranks", ())] == 2


def test_progress_is_a_bar_on_a_terminal_and_log_lines_otherwise(caplog):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    show = progress_printer(screen)
    row = ShapeResult(kernel="ag_gemm", key={"M": 8, "N": 8, "K": 8, "world": 2}, source="tuned")
    show(1, 2, row)
    show(2, 2, row.model_copy(update={"source": "failed", "error": "boom"}))
    assert "\r[############............] 1/2 ag_gemm M=8 N=8 K=8: tuned" in screen.getvalue()
    assert "2/2 ag_gemm M=8 N=8 K=8: failed: boom" in screen.getvalue()
    assert "FAILED" not in screen.getvalue()  # not "failed FAILED"
    show(2, 2, row.model_copy(update={"source": "registry", "error": "bad output"}))
    assert "registry FAILED: bad output" in screen.getvalue()
    with caplog.at_level(logging.INFO, logger="warmup.run.runner"):
        progress_printer(io.StringIO())(1, 1, row)
    assert "warmed 1/1 ag_gemm M=8 N=8 K=8: tuned" in caplog.text


def test_a_shape_its_kernel_rejects_is_refused_before_any_write(tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "version: 1\nentries:\n  - {kernel: ag_gemm, dtype: fp32, world_size: 2,\n"
        "     shapes: [{M: [32, 63], N: 32, K: 32}]}\n"
    )
    with pytest.raises(ManifestError, match="M=63 is not a multiple of world_size 2"):
        load_manifest(manifest)  # what run, warm() and a torchrun rank read it with
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v").mkdir()
    argv = ["run", "--manifest", str(manifest), "--volume", str(tmp_path / "v")]
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == 2
    assert "ag_gemm rejects 1 shape(s): M=63" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml", "v"]  # no work folder


IN_PROCESS = """
import sys, warmup
from warmup.core.settings import Settings
if sys.argv[2] == "import-first":
    import triton
settings = Settings(volume="v", work_dir="w", device="cpu", create_volume=True)
status = warmup.warm(sys.argv[1], settings)
print(status.state, status.sources)
"""


def test_warm_in_process_on_cpu_turns_the_interpreter_on_or_says_why_it_cannot(tmp_path):
    manifest = manifest_of(tmp_path, entry("matmul", 1, "{M: 16, N: 16, K: 16}"))
    env = {**env_without_interpreter(), "PYTHONPATH": str(ROOT)}

    def warm(mode):
        return run_python("-c", IN_PROCESS, str(manifest), mode, cwd=tmp_path, env=env)

    done = warm("plain")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ready {'tuned': 1}"
    late = warm("import-first")
    assert late.returncode == 1
    assert (
        "triton is already imported without TRITON_INTERPRET=1: set TRITON_INTERPRET=1"
        in late.stderr
    )


def user_manifest(tmp_path: Path, *entries: tuple[int, int]) -> Path:
    """A manifest of ``record_call`` entries, one per (world size, M)."""
    calls = (entry(USER + "record_call", world, f"{{M: {m}, N: 2, K: 2}}") for world, m in entries)
    return manifest_of(tmp_path, *calls)


@pytest.mark.parametrize("policy", ["degraded", "fail"])
def test_entries_for_another_world_size_are_skipped_out_loud(tmp_path, monkeypatch, caplog, policy):
    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "calls.jsonl"))
    manifest = user_manifest(tmp_path, (2, 2), (4, 4))
    skipped = "entries.1 (tests.warmup.user_functions:record_call, world size 4)"
    settings = settings_for(tmp_path, manifest=manifest, world_size=2, other_world_sizes=policy)
    if policy == "fail":  # bad input, refused before any rank starts or anything is written
        with pytest.raises(ManifestError) as info:
            run(settings, load_manifest(manifest))
        assert info.value.errors == [
            "1 manifest entries are for other world sizes than this pod's 2 ranks, and "
            f"other_world_sizes is 'fail': {skipped}"
        ]
        assert not settings.paths.work_dir.exists() and not (tmp_path / "calls.jsonl").exists()
        return
    with caplog.at_level(logging.WARNING, logger="warmup.run.launch"):
        status = run(settings, load_manifest(manifest))
    assert status.skipped_entries == [skipped] and status.sources == {"user": 2}
    assert f"skipping {skipped}: this pod has 2 ranks" in caplog.text
    assert samples(settings.paths.run_metrics_file)["triton_warmup_skipped_entries", ()] == 1
    assert status.ready and status.degraded  # ready, and the status says what it left out
    assert RunStatus.read(settings.paths.status_file).degraded  # type: ignore[union-attr]


def test_a_dead_rank_is_seen_while_a_lower_rank_still_runs():
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
        subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]),
    ]
    started = time.monotonic()
    failures, errors = _wait(procs, limit_s=120, grace_s=1)
    assert time.monotonic() - started < 20  # the grace, not rank 0's minute
    assert [str(f) for f in failures] == ["rank 0 was stopped", "rank 1 exited with code 3"]
    assert errors == [] and all(p.returncode is not None for p in procs)


def test_a_launcher_failure_stops_every_rank_and_says_why(tmp_path, monkeypatch):
    started = []

    def sleepers(settings, manifest, world, run_dir, early):
        started.extend(
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            for _ in range(world)
        )
        return started

    def volume_gone(settings, manifest):
        raise OSError("the volume went away")

    monkeypatch.setattr(warmup.run.launch, "_spawn_ranks", sleepers)
    monkeypatch.setattr(warmup.run.launch, "restore", volume_gone)
    settings = settings_for(tmp_path)
    with pytest.raises(OSError):
        run(settings, load_manifest(DEMO))
    assert len(started) == 2 and all(p.returncode is not None for p in started)
    status = RunStatus.read(settings.paths.status_file)
    assert status.state == "failed" and status.failures == ["OSError: the volume went away"]


def test_warm_in_process_says_running_while_it_warms(tmp_path, monkeypatch):
    manifest = manifest_of(tmp_path, entry(USER + "record_status", 1, "{M: 1, N: 1, K: 1}"))
    settings = settings_for(tmp_path, manifest=manifest, create_volume=True)
    monkeypatch.setenv("TEST_STATUS_PATH", str(settings.paths.status_file))
    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "states"))
    RunStatus(
        state="ready", manifest_digest=load_manifest(manifest).digest(), started=0, world_size=1
    ).write(settings.paths.status_file)  # a previous run's, for the same manifest
    assert warmup.warm(manifest, settings).ready
    assert (tmp_path / "states").read_text() == "running\n"  # never the stale "ready"


def test_a_remote_tier_that_never_answers_costs_a_warning_not_the_warmup(tmp_path):
    """Nothing listens at the remote tier's URL: every shape is tuned and stored on the
    volume, the run is ready, and the status and metrics count the failed and skipped
    calls: while the tier is down, calls are skipped, except the lookup before each
    tuning (it may spare one) and the publish of what was held back, at the end."""
    from tests.conftest import free_port

    settings = settings_for(tmp_path, remote_url=f"redis://127.0.0.1:{free_port()}/0")
    status = run(settings, load_manifest(DEMO))
    assert status.ready and status.sources == {"tuned": 6}
    shapes = 3
    assert status.remote is not None and status.remote.errors == 1 + shapes + 1
    # the other first lookups, and every publish (held back for the end)
    assert status.remote.skipped == (shapes - 1) + shapes and status.remote.hits == 0
    assert len(Store(settings.paths.layout.registry)) == shapes
    found = samples(settings.paths.run_metrics_file)
    assert found[("triton_warmup_remote_tier_calls_total", (("result", "error"),))] == 5.0
    assert set(status.phases) >= {"imports", "restore", "rank_start", "setup", "tune", "save"}
    assert sum(status.phases.values()) - status.phases["restore"] <= status.duration_s + 0.5


def test_what_a_killed_writer_left_is_cleared_at_the_start_and_counted(
    tmp_path, monkeypatch, make_entry
):
    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "calls.jsonl"))
    manifest = user_manifest(tmp_path, (1, 2))
    settings = settings_for(tmp_path, manifest=manifest, world_size=1)
    Store(settings.paths.registry_dir, create=True).put(make_entry())
    current = settings.paths.registry_dir / "current"
    stale = current.resolve() / ".tmp-99-killed.json"  # a put killed before its rename
    stale.write_text("{")
    status = run(settings, load_manifest(manifest))
    assert status.ready and not stale.exists()
    counted = samples(settings.paths.run_metrics_file)
    assert counted["triton_warmup_run_recovered_total", (("what", "temp_files"),)] == 1


def test_a_trusted_keys_folder_that_is_not_there_stops_the_run_before_any_rank(tmp_path):
    from registry.trust.signing import KeyFileError

    settings = settings_for(tmp_path).updated(trusted_keys=tmp_path / "typo")
    with pytest.raises(KeyFileError, match="typo does not exist"):
        run(settings, load_manifest(DEMO))
    assert not (tmp_path / "work" / "run").exists()
