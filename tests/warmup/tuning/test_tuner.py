"""The tuner with a fake timer: search, registry flow, policies, failures."""

import json
import logging
import threading
import time

import pytest

from registry import Entry, KernelConfig, Store, cpu_fingerprint
from registry.locks import backend_from_url, lock
from tests.warmup.tuning.fakes import FakeTask, configs, fake_timer
from warmup.core.collectives import RankFailure
from warmup.tuning.tuner import TuneError, TuneOptions, Tuner

TIMINGS = {16: 3.0, 32: 1.2, 64: 0.9, 128: 1.1, 256: 2.5}


def tuner_for(task, tmp_path, **options):
    store = Store(tmp_path / "registry", create=True)
    return Tuner(
        store,
        cpu_fingerprint(),
        timer=fake_timer(task),
        lock_backend=backend_from_url(str(tmp_path / "locks")),
        options=TuneOptions(**options),
    )


def test_a_miss_is_tuned_verified_and_stored_then_hits(tmp_path):
    task = FakeTask(dict(TIMINGS), broken={256: "ptxas: too many resources"}, wrong={16})
    tuner = tuner_for(task, tmp_path)
    outcome = tuner.get(task)
    assert outcome.source == "tuned" and outcome.config.meta["BLOCK"] == 64
    assert outcome.benchmark_runs > 0 and tuner.stats.tuned == 1
    stored = tuner.store.lookup(
        "fake_gemm", task.key(), cpu_fingerprint().with_kernel(task.kernel_hash)
    )
    assert stored == outcome.entry and stored.best.meta["BLOCK"] == 64
    reasons = {m.config.meta["BLOCK"]: m.error for m in stored.measurements if not m.ok}
    assert reasons == {
        256: "RuntimeError: ptxas: too many resources",
        16: "differs from the reference",
    }
    fresh = FakeTask(dict(TIMINGS))
    again = tuner_for(fresh, tmp_path).get(fresh)
    assert again.source == "registry" and again.benchmark_runs == 0 and fresh.launches == 0


def test_halving_times_the_leaders_longer(tmp_path):
    timings = {b: 1.0 + abs(b - 40) / 10 for b in range(8, 80, 4)}  # 18 configs
    task = FakeTask(timings)
    tuner = tuner_for(task, tmp_path)
    outcome = tuner.get(task)
    assert outcome.config.meta["BLOCK"] == 40
    sizes = [len(r) for r in outcome.search.rounds]
    assert sizes == [18, 9, 5, 3, 2]  # eta 2: halve until two remain
    assert sorted(set(tuner.timer.calls)) == [1, 2, 4, 8, 16]  # per pass, doubling


@pytest.mark.parametrize("baseline_ms,stored", [(0.95, 16), (1.2, 32)])
def test_the_baseline_keeps_its_place_unless_beaten_beyond_noise(tmp_path, baseline_ms, stored):
    """32 runs 0.9 ms at the median but +-20% from one repetition to the next: against a
    baseline at 0.95 ms that is a tie, and the baseline is stored; against 1.2 ms, a win."""
    task = FakeTask({16: baseline_ms, 32: 0.9, 64: 2.0}, baseline_block=16)
    tuner = tuner_for(task, tmp_path)
    tuner.timer = fake_timer(task, spread={32: 0.2})
    outcome = tuner.get(task)
    assert outcome.config.meta["BLOCK"] == stored == outcome.entry.best.meta["BLOCK"]


def test_policy_fallback_uses_the_nearest_tuned_shape_or_the_default(tmp_path):
    for m in (512, 8192):
        task = FakeTask({16: 1.0, 32: 0.5} if m == 512 else {16: 0.5, 32: 1.0}, m=m)
        tuner_for(task, tmp_path).get(task)
    near = FakeTask(dict(TIMINGS), m=768)  # log-closer to 512 than to 8192
    tuner = tuner_for(near, tmp_path, policy="fallback")
    outcome = tuner.get(near)
    assert outcome.source == "fallback" and outcome.config.meta["BLOCK"] == 32
    assert tuner.stats.fallbacks == 1 and near.launches == 0
    other = FakeTask(dict(TIMINGS), kernel="other_kernel")
    default = tuner_for(other, tmp_path, policy="fallback").get(other)
    assert default.config == other.candidates()[0]


def test_policy_fail_raises_on_a_miss(tmp_path):
    task = FakeTask(dict(TIMINGS))
    with pytest.raises(TuneError, match="policy is 'fail'"):
        tuner_for(task, tmp_path, policy="fail").get(task)


def test_every_candidate_failing_is_a_named_error_and_stores_nothing(tmp_path):
    task = FakeTask({16: 1.0, 32: 1.0}, broken={16: "no", 32: "nope"})
    tuner = tuner_for(task, tmp_path)
    with pytest.raises(TuneError, match="every candidate failed"):
        tuner.get(task)
    assert len(tuner.store.local) == 0


def test_a_timer_of_two_arguments_still_works_in_one_process(tmp_path):
    task = FakeTask(dict(TIMINGS))
    tuner = tuner_for(task, tmp_path)
    tuner.timer = lambda fn, repetitions: [fn(), TIMINGS[task.last]][1:] * repetitions
    assert tuner.get(task).config.meta["BLOCK"] == 64


def test_a_peer_lost_while_timing_fails_the_tuning_not_the_config(tmp_path):
    """A meeting that times out is no slow config: scoring it inf would let this rank
    go on while its peer still waits in the meeting."""
    task = FakeTask(dict(TIMINGS))
    tuner = tuner_for(task, tmp_path)

    def timer(fn, repetitions, meet=None):
        raise RankFailure("rank 0/2: start of a repetition (meet) did not complete")

    tuner.timer = timer
    with pytest.raises(RankFailure, match="meet"):
        tuner.get(task)
    assert len(tuner.store.local) == 0


def test_a_winner_that_fails_its_final_check_is_not_stored(tmp_path):
    class Flaky(FakeTask):
        checks = 0

        def verify(self, output):  # passes when first measured, fails the final check
            self.checks += 1
            return "drifted" if self.checks > 2 else super().verify(output)

    task = Flaky({16: 1.0, 32: 2.0})
    tuner = tuner_for(task, tmp_path)
    with pytest.raises(TuneError, match="failed its check"):
        tuner.get(task)
    assert len(tuner.store.local) == 0


def test_empty_space_is_refused(tmp_path):
    task = FakeTask({})
    with pytest.raises(TuneError, match="empty"):
        tuner_for(task, tmp_path).get(task)
    assert configs() == []


@pytest.mark.parametrize("where", ["lock", "lookup", "put"])
def test_any_failure_of_the_lock_or_store_is_a_failed_shape(tmp_path, monkeypatch, where):
    task = FakeTask(dict(TIMINGS))
    tuner = tuner_for(task, tmp_path)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")  # not a RegistryError

    if where == "lock":
        monkeypatch.setattr(tuner.lock_backend, "try_acquire", broken)
    else:
        monkeypatch.setattr(tuner.store.local, where, broken)  # under the remote tier
    with pytest.raises(TuneError, match="No space left on device"):  # once: an OSError
        tuner.get(task)


@pytest.mark.parametrize(
    ("cpus", "world", "set_to", "workers"),
    [(16, 1, None, 16), (16, 4, None, 4), (6, 4, None, 1), (2, 8, None, 1), (16, 4, 3, 3)],
)
def test_the_compile_pool_shares_the_pods_cpus_among_its_ranks(
    tmp_path, monkeypatch, cpus, world, set_to, workers
):
    # every rank of a pod compiles at once: W pools of the node's count would fork W
    # times the CPUs the container may use
    monkeypatch.setattr("warmup.tuning.tuner.usable_cpus", lambda: cpus)
    tuner = tuner_for(FakeTask({16: 1.0}), tmp_path, compile_workers=set_to)
    monkeypatch.setattr(tuner.lockstep, "world", world)
    assert tuner._compile_workers() == workers


@pytest.mark.parametrize("lost", ["while searching", "after the search"])
@pytest.mark.parametrize("other", [False, True])
def test_a_holder_that_lost_its_lock_stops_or_writes_only_once_it_holds_it_again(
    tmp_path, redis_url, caplog, lost, other
):
    # a redis restart lost the lock key while rank 0 tuned; ``other``: another pod took
    # the lock meanwhile, and stores its own tuning before it releases. Lost while
    # searching: the heartbeat sees it and the search stops at its next measurement;
    # after the search: the check before the put sees it, and the put waits for the lock
    backend = backend_from_url(redis_url)
    backend.client.flushall()  # type: ignore[attr-defined]
    task = FakeTask(dict(TIMINGS))
    store = Store(tmp_path / "registry", create=True)
    tuner = Tuner(
        store,
        cpu_fingerprint(),
        timer=fake_timer(task),
        lock_backend=backend,
        options=TuneOptions(parallel_compile=False, lock_ttl_s=60.0),
    )
    tuned = tuner.tune
    theirs = KernelConfig.make({"BLOCK": 16})
    holding = threading.Event()
    searches = []

    def other_pod(name):
        with lock(name, backend=backend_from_url(redis_url), ttl=5.0, timeout=5.0):
            holding.set()
            time.sleep(0.5)  # still tuning when the first holder wants to store
            fp = cpu_fingerprint().with_kernel(task.kernel_hash)
            store.put(Entry.make("fake_gemm", task.key(), fp, theirs, source="tuned"))

    def lose_the_key():
        backend.client.flushall()  # type: ignore[attr-defined]
        if other:
            name = f"tune/fake_gemm/{json.dumps(task.key(), sort_keys=True)}"
            threading.Thread(target=other_pod, args=(name,), daemon=True).start()
            assert holding.wait(5)

    def tune_and_lose_the_key(t, **kw):
        searches.append(task.launches)
        if len(searches) > 1:
            return tuned(t, **kw)
        if lost == "after the search":
            found = tuned(t, **kw)
            lose_the_key()
            return found
        lose_the_key()
        time.sleep(0.7)  # the heartbeat (every 0.5 s) sees it
        return tuned(t, **kw)

    tuner.tune = tune_and_lose_the_key
    with caplog.at_level(logging.WARNING, logger="warmup.tuning"):
        outcome = tuner.get(task)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("warmup.tuning")]
    if lost == "while searching":
        assert "lost while tuning: the search stops" in lines[0]
        stopped_after = searches[1] if len(searches) > 1 else task.launches
        assert stopped_after == 2  # the first candidate's check and one timed pass
        assert tuner.stats.lock_lost == 1
        assert len(searches) == (1 if other else 2)  # the other's entry is used: no search
    else:
        assert "not storing until it is held again" in lines[0]
        assert "its key is gone" in lines[0] or "held by" in lines[0]
        assert tuner.stats.lock_lost == 0
    [stored] = store.entries()  # one landing: the new holder's, or this tuning once relocked
    if other:
        assert stored.best == theirs and outcome.config == theirs
        assert outcome.superseded or outcome.source == "registry"  # a hit after the stop
    else:
        assert stored.best.meta["BLOCK"] == 64 and outcome.config.meta["BLOCK"] == 64


def test_the_latency_timer_guards_the_winner_it_tunes(tmp_path):
    task = FakeTask(dict(TIMINGS), baseline_block=128)  # device: 64 at 0.9, 128 at 1.1
    tuner = tuner_for(task, tmp_path)
    tuner.latency_timer = (
        lambda fn, repetitions, meet=None, align=None: (
            [
                fn(),
                1.0 if task.last == 128 else 2.0,  # the winner slower issued just in time
            ][1:]
            * repetitions
        )
    )
    outcome = tuner.get(task)
    assert outcome.config.meta["BLOCK"] == 128 == outcome.entry.best.meta["BLOCK"]
    assert outcome.notes[0].startswith("latency guard: the baseline first")


def test_options_and_lock_backend_set_after_construction_are_the_ones_used(tmp_path):
    task = FakeTask(dict(TIMINGS))
    tuner = tuner_for(task, tmp_path)
    tuner.lock_backend = backend_from_url("redis://127.0.0.1:1/0")  # nothing listens there
    tuner.options = TuneOptions(lock_outage_s=0.0, parallel_compile=False)
    outcome = tuner.get(task)
    assert outcome.source == "tuned" and outcome.unlocked and tuner.stats.unlocked == 1
