"""The tuner's options and answers: the waits the ranks give rank 0, a hit's outcome."""

from registry import Entry, KernelConfig, cpu_fingerprint
from warmup.tuning.outcome import TuneOptions, TuneOutcome


def test_the_ranks_wait_for_rank_0s_store_and_lock_past_its_own_timeouts():
    options = TuneOptions(lock_timeout_s=100.0, rank_timeout_s=7.0)
    assert options.store_wait(5.0) == 12.0  # the store's write lock, then the rank's
    assert options.lock_wait() == 107.0


def test_a_hit_is_the_stored_entry_used_as_it_is():
    config = KernelConfig.make({"BLOCK": 64})
    entry = Entry.make("fake_gemm", {"M": 8}, cpu_fingerprint(), config, source="tuned")
    outcome = TuneOutcome.hit((entry, "remote"), 0.5, lock_wait_s=0.25)
    assert (outcome.config, outcome.source, outcome.entry) == (config, "remote", entry)
    assert (outcome.seconds, outcome.lock_wait_s, outcome.benchmark_runs) == (0.5, 0.25, 0)
    assert outcome.search is None and not outcome.superseded and outcome.notes == []
