"""Time to ready by phase: the clock a rank keeps, the run's fold of the ranks', the
table ``triton-warmup status`` prints and the metric the dashboard reads."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from warmup.cli import main
from warmup.core.metrics import RunMetrics
from warmup.core.results import READY, RemoteCounts, RunStatus
from warmup.run.phases import PHASES, PhaseClock, phase_table, process_age, run_phases


def test_a_clock_adds_up_each_phase_and_times_a_lazy_iterable():
    clock = PhaseClock()
    clock.add("lookup", 0.25)
    clock.add("lookup", 0.5)
    clock.add("tune", -1.0)  # a clock step backwards is no negative time

    def slow_items():
        for i in range(3):
            time.sleep(0.02)
            yield i

    seen = []
    for item in clock.timed_items("setup", slow_items()):
        seen.append(item)
        time.sleep(0.05)  # the consumer's time is not the iterable's
    assert seen == [0, 1, 2]
    assert clock.seconds["lookup"] == 0.75 and clock.seconds["tune"] == 0.0
    assert 0.06 <= clock.seconds["setup"] < 0.15
    with pytest.raises(AssertionError):
        clock.add("no such phase", 1.0)


def test_process_age_is_this_process_s_lifetime():
    assert 0.0 < process_age() < time.monotonic() + 1e6  # a running process is older than 0


def test_the_run_takes_the_slowest_rank_s_phases_in_run_order():
    # Rank 1 started late (rank_start) and rank 0 waited for it (rendezvous): the run
    # takes the slowest rank's phases, not each phase's maximum, which would count both.
    ranks = [
        {"rank_start": 1.0, "rendezvous": 1.5, "tune": 3.0},
        {"rank_start": 2.5, "rendezvous": 0.1, "tune": 3.0, "lock_wait": 0.5},
    ]
    phases = run_phases({"save": 0.2, "imports": 0.1, "restore": 0.4}, ranks)
    assert phases == {
        "imports": 0.1,
        "restore": 0.4,
        "rank_start": 2.5,
        "rendezvous": 0.1,
        "tune": 3.0,
        "lock_wait": 0.5,
        "save": 0.2,
    }
    assert list(phases) == [name for name in PHASES if name in phases]


def test_the_table_shows_shares_and_what_no_phase_holds():
    lines = phase_table({"imports": 1.0, "restore": 2.0, "tune": 5.0}, 10.0)
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["tune"][1:3] == ["5.00", "50.0%"]
    assert rows["other"][1] == "4.00"  # restore overlaps the ranks' start: not counted
    assert rows["total"][1] == "10.00"
    assert phase_table({"tune": 1.0}, None)[-1].split()[:2] == ["tune", "1.00"]


def test_the_metrics_export_each_phase_and_the_remote_tier_s_calls():
    metrics = RunMetrics(CollectorRegistry())
    remote = RemoteCounts(hits=3, misses=1, published=2, errors=1, skipped=4)
    metrics.record_run(2, 12.5, {"tune": 7.0, "save": 0.5}, remote)
    text = generate_latest(metrics.registry).decode()
    assert 'triton_warmup_phase_seconds{phase="tune"} 7.0' in text
    assert 'triton_warmup_remote_tier_calls_total{result="skipped"} 4.0' in text
    assert 'triton_warmup_remote_tier_calls_total{result="hit"} 3.0' in text
    assert "triton_warmup_warmup_duration_seconds 12.5" in text


def _status(tmp_path, **fields):
    status = RunStatus(
        state=READY,
        manifest_digest="d",
        started=0.0,
        duration_s=10.0,
        world_size=2,
        **fields,
    )
    return status.write(tmp_path / "status.json")


def test_status_prints_the_phase_table_and_the_remote_tier(tmp_path, capsys):
    remote = RemoteCounts(hits=2, published=1)
    _status(tmp_path, phases={"rank_start": 2.0, "tune": 6.0}, remote=remote)
    assert main(["status", "--file", str(tmp_path / "status.json")]) == 0
    out = capsys.readouterr().out
    assert "warmup ready" in out and "rank_start" in out and "60.0%" in out
    assert "remote tier: hits 2, misses 0, published 1" in out
    assert "trust:" not in out  # a status written before trust was recorded


@pytest.mark.parametrize(
    "mode,says",
    [
        ("signed", "trust: signed\n"),
        ("code-refused", "code from bundles and the remote tier refused"),
        ("unsigned-allowed", "TRITON_WARMUP_ALLOW_UNSIGNED=true: unsigned code accepted"),
    ],
)
def test_status_shows_the_runs_trust_mode(tmp_path, capsys, mode, says):
    _status(tmp_path, trust=mode)
    assert main(["status", "--file", str(tmp_path / "status.json")]) == 0
    out = capsys.readouterr().out
    assert f"trust: {mode}" in out and says in out


def test_status_exit_codes_and_json(tmp_path, capsys):
    assert main(["status", "--file", str(tmp_path / "none.json")]) == 2
    assert "no readable status" in capsys.readouterr().err
    _status(tmp_path, phases={"tune": 1.0}).model_copy(update={"state": "failed"}).write(
        tmp_path / "status.json"
    )
    assert main(["status", "--file", str(tmp_path / "status.json"), "--json"]) == 1
    assert RunStatus.model_validate_json(capsys.readouterr().out).phases == {"tune": 1.0}
