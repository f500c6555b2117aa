"""The start-up phases: recorded only when asked, on the recording thread alone."""

from __future__ import annotations

import threading
import time

from kernels import startup


def test_phases_and_counts_add_up_only_inside_a_recording():
    with startup.phase("outside"):
        startup.count("outside")
    with startup.recording() as record:
        for _ in range(2):
            with startup.phase("outer"), startup.phase("inner"):
                time.sleep(0.01)
        startup.count("made", 3)
    assert record.counts == {"inner": 2, "outer": 2, "made": 3}
    assert record.seconds["outer"] >= record.seconds["inner"] >= 0.02
    assert record.to_json()["counts"] == record.counts


def test_a_thread_the_recording_did_not_start_records_nothing():
    with startup.recording() as record:
        thread = threading.Thread(target=lambda: startup.count("follower"))
        thread.start()
        thread.join()
    assert record.counts == {}
