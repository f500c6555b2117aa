"""The tuner across processes: ranks in lockstep over gloo, a killed rank, a fleet race."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry import Store

ROOT = Path(__file__).parents[3]
pytestmark = pytest.mark.slow


def run(scenario: str, world: int, work: Path, *, expect_killed=()) -> dict[int, dict]:
    start_at = time.time() + 3.0
    procs = {
        rank: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.warmup.tuning._tuner_ranks",
                scenario,
                str(world),
                str(rank),
                str(work),
                str(start_at),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    }
    results = {}
    for rank, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        if rank in expect_killed:
            assert proc.returncode == -signal.SIGKILL
            continue
        assert proc.returncode == 0, err[-3000:]
        results[rank] = json.loads(out.strip().splitlines()[-1])
    return results


def test_ranks_agree_on_the_winner_timed_as_the_max_over_ranks(tmp_path):
    results = run("agreement", 3, tmp_path)
    assert {r["block"] for r in results.values()} == {32}  # 16 is slow on rank 1 only
    assert {r["source"] for r in results.values()} == {"tuned"}
    assert {r["stored"] for r in results.values()} == {32}
    assert len(Store(tmp_path / "registry")) == 1  # one writer
    for r in results.values():  # every repetition started with all ranks together
        assert r["meetings"] == r["alignments"] == r["repetitions"] > 0, r


def test_rank_zeros_view_of_hit_or_miss_wins(tmp_path):
    results = run("disagree", 3, tmp_path)
    assert {r["source"] for r in results.values()} == {"tuned"}  # rank 0 missed: all tune
    assert {r["block"] for r in results.values()} == {32}
    assert all(r["launches"] > 0 for r in results.values())
    assert len(Store(tmp_path / "registry-0")) == 1
    stale = Store(tmp_path / "registry-1").entries()[0]
    assert stale.best.meta["BLOCK"] == 16  # followers never write


def test_a_killed_rank_makes_the_others_fail_clearly_within_the_timeout(tmp_path):
    results = run("killed", 2, tmp_path, expect_killed={1})
    survivor = results[0]
    assert survivor["error"] and "did not complete" in survivor["error"]
    assert survivor["seconds"] < 30 and survivor["stored"] == 0


def test_two_processes_tuning_one_key_give_one_tuning_and_one_entry(tmp_path):
    results = run("same_key", 2, tmp_path)
    assert sorted(r["source"] for r in results.values()) == ["registry", "tuned"]
    assert {r["block"] for r in results.values()} == {32}
    waiter = next(r for r in results.values() if r["source"] == "registry")
    assert waiter["lock_wait_s"] > 0.2  # it waited for the tuner, then found the entry
    assert len(Store(tmp_path / "registry")) == 1


def test_a_lock_server_rank_zero_cannot_reach_delays_the_shape_then_all_tune_it(tmp_path):
    results = run("lock_server_gone", 2, tmp_path)
    assert {(r["gone"], r["unlocked"]) for r in results.values()} == {("tuned", True)}
    assert all(0.5 <= r["seconds"] < 10 for r in results.values())  # not lock_timeout_s
    assert {r["next"] for r in results.values()} == {"tuned"}
