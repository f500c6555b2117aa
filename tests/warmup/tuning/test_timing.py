import time

from warmup.tuning.timing import wall_clock_timer


def test_wall_clock_timer_warms_up_then_times_each_repetition():
    calls = []
    times = wall_clock_timer(warmup=2)(lambda: calls.append(1), 5)
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)


def test_ranks_meet_before_every_repetition_and_the_meeting_is_not_timed():
    events = []

    def meet():
        events.append("meet")
        time.sleep(0.02)  # a slow peer: waiting for it is not the op's time

    times = wall_clock_timer(warmup=1)(lambda: events.append("run"), 3, meet=meet)
    assert events == ["run"] + ["meet", "run"] * 3  # the warm-up call meets nobody
    assert max(times) < 15  # ms: the 20 ms meetings stay outside the clock
