from warmup.timing import wall_clock_timer


def test_wall_clock_timer_warms_up_then_times_each_repetition():
    calls = []
    times = wall_clock_timer(warmup=2)(lambda: calls.append(1), 5)
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)
