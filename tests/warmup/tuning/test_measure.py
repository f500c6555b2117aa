"""The search on every rank with fake timers, the registry left out: candidates checked
once, timed, failures kept; the parallel compile; the latency guard's say."""

import pytest

from tests.warmup.tuning.fakes import FakeTask, fake_timer
from warmup.core.collectives import Lockstep
from warmup.tuning import measure
from warmup.tuning.measure import TuneError, compile_candidates, search_candidates
from warmup.tuning.search import HalvingPlan

TIMINGS = {16: 3.0, 32: 1.2, 64: 0.9, 128: 1.1, 256: 2.5}


def search(task, **options):
    options.setdefault("timer", fake_timer(task))
    return search_candidates(task, lockstep=Lockstep(), plan=HalvingPlan(), **options)


def test_each_candidate_is_checked_once_then_timed_and_each_failure_keeps_its_reason():
    task = FakeTask(dict(TIMINGS), broken={256: "ptxas: too many resources"}, wrong={16})
    found = search(task)
    assert found.best.meta["BLOCK"] == 64 and found.search.best.config == found.best
    reasons = {m.config.meta["BLOCK"]: m.error for m in found.search.measurements if not m.ok}
    assert reasons == {
        256: "RuntimeError: ptxas: too many resources",
        16: "differs from the reference",
    }
    assert found.notes == [] and found.pool is None and found.cache_files_added is None
    # the final check ran the winner last
    assert task.last == 64


def test_halving_times_the_leaders_longer():
    timings = {b: 1.0 + abs(b - 40) / 10 for b in range(8, 80, 4)}  # 18 configs
    task = FakeTask(timings)
    timer = fake_timer(task)
    found = search(task, timer=timer)
    assert found.best.meta["BLOCK"] == 40
    assert [len(r) for r in found.search.rounds] == [18, 9, 5, 3, 2]  # eta 2: halve to two
    assert sorted(set(timer.calls)) == [1, 2, 4, 8, 16]  # per pass, doubling


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (FakeTask({}), "fake_gemm at {'M': 1024, 'dtype': 'bf16'}: the config space is empty."),
        (
            FakeTask({16: 1.0, 32: 1.0}, broken={16: "no", 32: "nope"}),
            "every candidate failed (BLOCK=16 w4 s3: RuntimeError: no; BLOCK=32 w4 s3: "
            "RuntimeError: nope).",
        ),
    ],
)
def test_an_empty_space_or_every_candidate_failing_is_a_tune_error(task, message):
    with pytest.raises(TuneError) as info:
        search(task)
    assert str(info.value).endswith(message)


def test_a_winner_that_fails_its_check_again_is_a_tune_error():
    class Flaky(FakeTask):
        checks = 0

        def verify(self, output):  # passes when first measured, fails the final check
            self.checks += 1
            return "drifted" if self.checks > 2 else super().verify(output)

    with pytest.raises(TuneError, match=r"the winner BLOCK=16 w4 s3 failed its check \(drifted\)"):
        search(Flaky({16: 1.0, 32: 2.0}))


def test_a_pool_compiles_only_when_sized_and_its_failure_leaves_the_warm_ups(monkeypatch):
    pools, warmed = [], []
    task = FakeTask(dict(TIMINGS))
    monkeypatch.setattr(task, "warmup", lambda config: warmed.append(config.meta["BLOCK"]))

    def precompile(thunks, workers):
        pools.append(workers)
        if workers > 2:
            raise OSError("no fork here")
        return "report"

    monkeypatch.setattr(measure.compile_pool, "precompile", precompile)
    candidates = task.candidates()
    assert compile_candidates(task, candidates, workers=None) is None and pools == []
    assert compile_candidates(task, candidates, workers=lambda: 2) == "report"
    assert compile_candidates(task, candidates, workers=lambda: 3) is None  # skipped
    assert pools == [2, 3] and warmed == list(TIMINGS) * 3  # each warmed in-process every time


@pytest.mark.parametrize(("winner_latency", "expected"), [(1.09, 64), (1.1, 128)])
def test_the_winner_is_the_latency_guards_choice(winner_latency, expected):
    task = FakeTask(dict(TIMINGS), baseline_block=128)  # device: 64 at 0.9, 128 at 1.1

    def latency_timer(fn, repetitions, meet=None, align=None):
        fn()
        return [{64: winner_latency, 128: 1.1}[task.last]] * repetitions

    found = search(task, latency_timer=latency_timer)
    assert found.best.meta["BLOCK"] == expected == found.search.best.config.meta["BLOCK"]
    assert found.notes and found.notes[0].startswith("latency guard")


def test_only_a_timer_that_names_align_is_given_it():
    from warmup.tuning.measure import _takes

    def new(fn, repetitions, *, meet=None, align=None): ...

    def old(fn, repetitions, meet=None): ...

    def wrapper(*args, **kwargs):  # may hand align on to an old timer
        return old(*args, **kwargs)

    assert _takes(new, "align") and not _takes(old, "align")
    assert not _takes(wrapper, "align") and not _takes(print, "align")
