"""The fleet lock of one shape: taken, deferred, failed past its wait, or skipped in an
outage of its server."""

import contextlib
import math
import time

import pytest

from registry import LockTimeout, lock
from registry.locks import backend_from_url
from tests.warmup.tuning.fakes import FakeTask
from warmup.core.collectives import Lockstep
from warmup.tuning.fleet_lock import FleetLock, Taken, lock_name
from warmup.tuning.measure import TuneError
from warmup.tuning.outcome import Deferred, TuneOptions, TunerStats

KEY = {"M": 1024, "dtype": "bf16"}
SILENT = "redis://127.0.0.1:1/0"  # nothing listens there


def _fleet_lock(url, **options):
    backend = backend_from_url(url)
    return FleetLock(Lockstep(), backend, TuneOptions(**options), TunerStats())


def test_one_lock_per_shape_named_by_its_sorted_key():
    assert lock_name("ag_gemm", {"N": 2, "M": 1}) == 'tune/ag_gemm/{"M": 1, "N": 2}'


def test_a_free_lock_is_held_until_the_stack_closes(tmp_path):
    fleet = _fleet_lock(str(tmp_path / "locks"))
    other = backend_from_url(str(tmp_path / "locks"))
    with contextlib.ExitStack() as held:
        taken = fleet.take(held, "fake_gemm", KEY, None)
        assert isinstance(taken, Taken) and taken.holder is not None and taken.unreachable is None
        with (
            pytest.raises(LockTimeout),
            lock(lock_name("fake_gemm", KEY), timeout=0, backend=other),
        ):
            pass
    with lock(lock_name("fake_gemm", KEY), timeout=0, backend=other):
        pass  # released with the stack


def test_a_lock_another_pod_holds_is_deferred_then_fails_past_give_up(tmp_path):
    fleet = _fleet_lock(str(tmp_path / "locks"), lock_timeout_s=0.1)
    other = backend_from_url(str(tmp_path / "locks"))
    name = lock_name("fake_gemm", KEY)
    with lock(name, ttl=30, timeout=5, backend=other), contextlib.ExitStack() as held:
        deferred = fleet.take(held, "fake_gemm", KEY, math.inf)
        assert isinstance(deferred, Deferred) and deferred.reason
        with pytest.raises(TuneError, match=r"lock not taken in 0\.1 s of waiting"):
            fleet.take(held, "fake_gemm", KEY, time.monotonic())
    assert fleet.stats.lock_wait_seconds == 0.0  # nothing taken, nothing counted


def test_a_silent_lock_server_defers_until_the_outage_is_long_enough():
    patient = _fleet_lock(SILENT, lock_outage_s=3600.0)
    with contextlib.ExitStack() as held:
        assert isinstance(patient.take(held, "fake_gemm", KEY, math.inf), Deferred)
    done = _fleet_lock(SILENT, lock_outage_s=0.0)
    with contextlib.ExitStack() as held:
        taken = done.take(held, "fake_gemm", KEY, math.inf)
    assert isinstance(taken, Taken) and taken.unreachable and taken.holder is None


def test_tuning_unlocked_is_counted_and_said(caplog):
    fleet = _fleet_lock(SILENT)
    task = FakeTask({16: 1.0})
    fleet.tuning_unlocked(task, task.key(), "unreachable for 31 s")
    assert fleet.stats.unlocked == 1
    assert "tuning without the fleet lock (unreachable for 31 s)" in caplog.text
