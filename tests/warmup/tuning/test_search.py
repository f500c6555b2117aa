import random

import pytest

from registry import Measurement
from tests.warmup.tuning.fakes import configs
from warmup.tuning.search import HalvingPlan, successive_halving, summarize


def measure_with(timings, *, noise=0.0, seed=0, failing=()):
    rng = random.Random(seed)
    log = []

    def measure(config, repetitions):
        block = config.meta["BLOCK"]
        log.append((block, repetitions))
        if block in failing:
            return Measurement(config, error="compile failed: out of shared memory")
        spread = noise / repetitions**0.5  # longer measurements are steadier
        times = [timings[block] * (1 + rng.uniform(-spread, spread)) for _ in range(repetitions)]
        return summarize(config, times)

    return measure, log


def test_picks_the_fastest_under_known_timings():
    timings = {16: 3.0, 32: 1.2, 64: 0.9, 128: 1.1, 256: 2.5}
    measure, _ = measure_with(timings)
    result = successive_halving(configs(*timings), measure)
    assert result.best.config.meta["BLOCK"] == 64
    assert [m.config.meta["BLOCK"] for m in result.measurements][:3] == [64, 128, 32]


def test_halving_measures_leaders_longer_and_keeps_the_true_best():
    timings = {b: 1.0 + abs(b - 40) / 100 for b in range(8, 72, 2)}  # 32 configs, best at 40
    for seed in range(20):
        measure, log = measure_with(timings, noise=0.05, seed=seed)
        result = successive_halving(
            configs(*timings),
            measure,
            HalvingPlan(first_repetitions=3, eta=3, final_survivors=2, passes=1),
        )
        assert result.best.config.meta["BLOCK"] == 40
    first, *later = result.rounds
    assert len(first) == 32 and len(later[0]) == 11 and len(later[-1]) <= 3
    exhaustive = 32 * max(r for _, r in log)
    assert result.repetitions < exhaustive / 3  # far cheaper than timing all long


def test_failures_drop_out_with_their_reason():
    timings = {16: 2.0, 32: 1.0, 64: 0.5}
    measure, log = measure_with(timings, failing={64})
    result = successive_halving(configs(*timings), measure)
    assert result.best.config.meta["BLOCK"] == 32
    failed = [m for m in result.measurements if not m.ok]
    assert failed[0].error.startswith("compile failed") and failed is not None
    assert result.measurements[-1] == failed[0]
    assert sum(1 for block, _ in log if block == 64) == 1  # never measured again


def test_all_failing_or_empty():
    measure, _ = measure_with({16: 1.0}, failing={16})
    assert not successive_halving(configs(16), measure).best.ok
    with pytest.raises(ValueError, match="empty space"):
        successive_halving([], measure)
    with pytest.raises(ValueError, match="eta"):
        HalvingPlan(eta=1)


def test_the_baseline_is_measured_in_every_round_and_loses_only_to_a_clear_winner():
    timings = {b: 1.0 + abs(b - 40) / 100 for b in range(8, 72, 4)}  # 16 configs, best 40
    timings[68] = 1.5  # the baseline: clearly slower than the best
    measure, _ = measure_with(timings)
    result = successive_halving(configs(*timings), measure, baseline=configs(68)[0])
    assert all(configs(68)[0] in measured for measured in result.rounds)
    assert result.best.config.meta["BLOCK"] == 40


def _spread(config, median, width):
    return summarize(config, [median * (1 - width + width * i / 5) for i in range(11)])


@pytest.mark.parametrize(
    "rival_spread,expected",
    [(0.10, "baseline"), (0.02, "rival")],  # p80 1.045 against p20 0.992: a tie; 0.959: a win
)
def test_a_near_tie_goes_to_the_baseline(rival_spread, expected):
    base, rival = configs(1, 2)

    def measure(config, repetitions):
        return _spread(config, 1.0, 0.01) if config == base else _spread(config, 0.95, rival_spread)

    result = successive_halving([rival, base], measure, baseline=base)
    assert result.best.config == {"baseline": base, "rival": rival}[expected]
    assert len(result.measurements) == 2


def test_one_disturbed_pass_moves_neither_the_median_nor_the_spread():
    """A rival 20% faster than the baseline, but one of its three passes hit a stall."""
    base, rival = configs(1, 2)
    calls = {rival: 0}

    def measure(config, repetitions):
        if config == base:
            return _spread(config, 1.0, 0.01)
        calls[rival] += 1
        return _spread(config, 3.0 if calls[rival] == 2 else 0.8, 0.01)

    result = successive_halving([rival, base], measure, HalvingPlan(passes=3), baseline=base)
    assert result.best.config == rival
    assert result.best.p80_ms < 0.82  # the stalled pass is outvoted, not the maximum


def test_summarize_gives_median_and_percentiles():
    m = summarize(configs(16)[0], [5.0, 1.0, 2.0, 4.0, 3.0])
    assert (m.median_ms, m.p20_ms, m.p80_ms) == (3.0, 2.0, 4.0)
    assert not summarize(configs(16)[0], []).ok


def test_each_round_interleaves_its_candidates_in_rotating_passes():
    timings = {16: 1.0, 32: 2.0, 64: 3.0}
    measure, log = measure_with(timings)
    successive_halving(
        configs(*timings), measure, HalvingPlan(first_repetitions=6, passes=3, final_survivors=3)
    )
    order = [block for block, _ in log]
    assert order == [16, 32, 64, 32, 64, 16, 64, 16, 32]  # each pass starts one later
    assert {reps for _, reps in log} == {2}  # 6 repetitions split over 3 passes


def test_a_pinned_baseline_costs_one_candidate_per_round_not_more_rounds():
    timings = {b: 1.0 + abs(b - 40) / 100 for b in range(8, 72, 4)}  # 16 configs, best 40
    timings[68] = 1.5  # the baseline, dropped on merit after the first round
    plain, _ = measure_with(timings)
    without = successive_halving(configs(*timings), plain)
    pinned, _ = measure_with(timings)
    with_baseline = successive_halving(configs(*timings), pinned, baseline=configs(68)[0])
    assert len(with_baseline.rounds) == len(without.rounds) == 4
    assert [len(r) for r in with_baseline.rounds] == [
        len(r) + (i > 0) for i, r in enumerate(without.rounds)
    ]


def test_a_config_dropped_early_never_outranks_the_last_round():
    """Clocks drift slower round after round: a config dropped in round 0 has the
    lowest time on record, but was never measured beside the finalists."""
    timings = {16: 1.0, 32: 1.01, 64: 1.2, 128: 1.3}

    def measure(config, repetitions):
        drift = 1.0 + 0.5 * (repetitions > 3)  # every later round runs 50% slower
        return summarize(config, [timings[config.meta["BLOCK"]] * drift] * repetitions)

    result = successive_halving(configs(*timings), measure, HalvingPlan(final_survivors=2))
    assert {c.meta["BLOCK"] for c in result.rounds[-1]} == {16, 32}
    assert result.best.config.meta["BLOCK"] == 16
    dropped = {m.config.meta["BLOCK"] for m in result.measurements[2:]}
    assert dropped == {64, 128}
