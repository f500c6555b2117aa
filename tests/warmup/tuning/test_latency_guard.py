"""The latency guard with fake timers: the winner against the baseline issued just in time."""

import pytest

from tests.warmup.tuning.fakes import FakeTask, configs
from warmup.core.collectives import Lockstep
from warmup.tuning.latency_guard import LATENCY_PASSES, latency_guard
from warmup.tuning.search import SearchResult, summarize

DEVICE_MS = {64: 0.9, 128: 1.1, 256: 2.5}  # the search's order: 64, 128 (the baseline), 256
BASELINE = configs(128)[0]


def searched(timings=DEVICE_MS) -> SearchResult:
    """A search's result, best first, as successive halving leaves it."""
    return SearchResult(
        [summarize(configs(b)[0], [timings[b]]) for b in sorted(timings, key=timings.get)]
    )


def latency_timer(task, latency_ms):
    """Just-in-time latency by BLOCK; runs the thunk once (so the task records it)."""
    seen = []

    def timer(fn, repetitions, meet=None, align=None):
        fn()
        seen.append(task.last)
        return [latency_ms[task.last]] * repetitions

    timer.seen = seen
    return timer


@pytest.mark.parametrize(
    ("winner_latency", "expected"),
    [(0.5, 64), (1.09, 64), (1.1, 128), (1.5, 128)],  # the baseline's: 1.1 ms
)
def test_a_winner_stays_first_only_if_it_is_faster_issued_just_in_time(winner_latency, expected):
    task = FakeTask(dict(DEVICE_MS), baseline_block=128)
    timer = latency_timer(task, {64: winner_latency, 128: 1.1})
    search = searched()
    notes = latency_guard(task, search, BASELINE, timer=timer, lockstep=Lockstep())
    assert timer.seen == [64, 128, 128, 64] * (LATENCY_PASSES // 2)  # interleaved passes
    assert search.best.config.meta["BLOCK"] == expected  # the recorded time is the first's
    assert [m.config.meta["BLOCK"] for m in search.measurements[1:]] == (
        [128, 256] if expected == 64 else [64, 256]
    )
    said = "kept" if expected == 64 else "the baseline first:"
    assert len(notes) == 1 and notes[0].startswith(f"latency guard: {said} BLOCK=64 ")
    assert "against the baseline's 1100 us issued just in time" in notes[0]


def test_no_guard_without_its_timer_a_baseline_or_a_rival():
    task = FakeTask(dict(DEVICE_MS), baseline_block=128)
    timer = latency_timer(task, dict.fromkeys(DEVICE_MS, 9.0))
    assert latency_guard(task, searched(), BASELINE, timer=None, lockstep=Lockstep()) == []
    assert latency_guard(task, searched(), None, timer=timer, lockstep=Lockstep()) == []
    won = searched({64: 1.2, 128: 1.1})  # the baseline won the search: nothing to check
    assert latency_guard(task, won, BASELINE, timer=timer, lockstep=Lockstep()) == []
    assert timer.seen == []


def test_a_call_that_fails_keeps_the_searchs_order():
    task = FakeTask(dict(DEVICE_MS), baseline_block=128)

    def failing(fn, repetitions, meet=None, align=None):
        fn()
        if task.last == 128:
            raise RuntimeError("out of memory")
        return [0.1] * repetitions

    search = searched()
    notes = latency_guard(task, search, BASELINE, timer=failing, lockstep=Lockstep())
    assert search.best.config.meta["BLOCK"] == 64  # the device clock's winner, not the guard's
    assert notes == ["latency guard: a call failed on some rank; the search's order kept"]
