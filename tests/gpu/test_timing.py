"""The tuner's device clock on a GPU: a call's host time stays out of its figure.

Skipped without a GPU (CI has none); run on a GPU machine with ``pytest tests/gpu``.
"""

import time

import pytest
import torch

from warmup.tuning.timing import DeviceHold, cuda_event_timer, cuda_latency_timer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _slow_host_call(host_s: float, device_us: float, cycles_per_us: float):
    """A call that spends ``host_s`` on the host before it launches ``device_us`` of work."""

    def call():
        until = time.perf_counter() + host_s
        while time.perf_counter() < until:
            pass
        torch.cuda._sleep(int(device_us * cycles_per_us))

    return call


def test_the_head_start_keeps_a_slow_hosts_time_out_and_the_latency_timer_sees_it():
    hold = DeviceHold(100.0)
    hold()  # calibrates
    cycles_per_us = hold._cycles / 100.0
    call = _slow_host_call(300e-6, 50.0, cycles_per_us)
    ahead = sorted(cuda_event_timer(head_start_us=1000.0)(call, 15))[7] * 1e3
    behind = sorted(cuda_event_timer(head_start_us=0.0)(call, 15))[7] * 1e3
    assert 35 < ahead < 90, ahead  # the device's 50 us, not the host's 300
    assert behind > 200, behind  # without it the host's time shows
    latency = sorted(cuda_latency_timer()(call, 15))[7] * 1e3
    assert 330 < latency < 600, latency  # the host's 300 us, then the device's 50
