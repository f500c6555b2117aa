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


def _shares(lines):
    """{phase: its share in %, or the share column's word}, read from a table's rows."""
    rows = [line.split() for line in lines[1:] if not line.startswith(("total", "("))]
    return {row[0]: float(row[2][:-1]) if row[2].endswith("%") else row[2] for row in rows}


def test_the_table_shows_shares_and_what_no_phase_holds():
    lines = phase_table({"imports": 1.0, "restore": 2.0, "rank_start": 3.0, "tune": 5.0}, 10.0)
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["tune"][1:3] == ["5.00", "50.0%"]
    assert rows["other"][1] == "1.00"  # restore runs beside the ranks' start: not counted
    assert rows["total"][1] == "10.00"
    assert phase_table({"tune": 1.0}, None)[-1].split()[:2] == ["tune", "1.00"]


def test_the_shares_add_up_to_the_run_and_a_phase_beside_another_is_marked():
    # The restore runs while the ranks start: a share of its own would count its
    # seconds twice (the table of a 2-rank demo run added up to 104 %).
    lines = phase_table({"imports": 0.7, "restore": 0.4, "rank_start": 6.0, "tune": 3.0}, 10.0)
    shares = _shares(lines)
    assert shares.pop("restore") == "beside"
    assert sum(shares.values()) == pytest.approx(100.0, abs=0.15)
    assert "(beside rank_start: no share of its own)" in next(
        line for line in lines if line.startswith("restore")
    )


def test_a_full_hit_s_restore_is_a_share_of_the_run_as_any_phase():
    # a full hit starts no rank: its restore runs beside nothing and counts (it added
    # up to 104.4 % when restore was always left out of "other")
    shares = _shares(phase_table({"imports": 0.67, "restore": 0.03}, 0.70))
    assert shares == {"imports": pytest.approx(95.7, abs=0.1), "restore": 4.3, "other": 0.0}


def test_phases_longer_than_the_run_are_shares_of_their_sum_and_say_so():
    # the slowest rank's clock and the launcher's can add up to more than the run
    lines = phase_table({"imports": 1.0, "rank_start": 4.0, "tune": 7.0}, 10.0)
    shares = _shares(lines)
    assert max(shares.values()) <= 100.0 and sum(shares.values()) == pytest.approx(100, abs=0.15)
    assert (
        lines[-1]
        == "(the phases add up to 12.00 s, more than the run's 10.00 s: shares are of their sum)"
    )


def test_the_metrics_export_each_phase_and_the_remote_tier_s_calls():
    metrics = RunMetrics(CollectorRegistry())
    remote = RemoteCounts(hits=3, misses=1, published=2, errors=1, skipped=4)
    metrics.record_run(2, 12.5, {"tune": 7.0, "save": 0.5}, remote, rank_processes=0)
    text = generate_latest(metrics.registry).decode()
    assert 'triton_warmup_phase_seconds{phase="tune"} 7.0' in text
    assert 'triton_warmup_remote_tier_calls_total{result="skipped"} 4.0' in text
    assert 'triton_warmup_remote_tier_calls_total{result="hit"} 3.0' in text
    assert "triton_warmup_warmup_duration_seconds 12.5" in text
    # the ranks the warm state is for, and the rank processes that ran (none: a full hit)
    assert "triton_warmup_ranks 2.0" in text and "triton_warmup_rank_processes 0.0" in text


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
