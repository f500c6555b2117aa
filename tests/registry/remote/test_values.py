"""The remote tier's values (``registry.remote.values``) on a real redis-server: a value
is read only within its limits, a slot's fields within the slot's budget."""

from __future__ import annotations

import logging
import tracemalloc

from registry import MatchPolicy
from registry.remote import values as remote_values
from registry.remote.tier import RemoteTier
from tests.conftest import gpu_fingerprint
from tests.registry.remote.test_tier import KEY, _messages, _slot


def test_a_value_over_the_limit_is_never_read(server, make_entry, h200, caplog):
    entry = make_entry()
    name = _slot(entry)
    server.client.hset(name, h200.digest(), b" " * (40 * 2**20))  # 40 MiB at the field
    tier = RemoteTier(server.url)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
            assert tier.fetch("ag_gemm", KEY, h200) is None
            assert tier.fetch("ag_gemm", KEY, h200, MatchPolicy.ANY) is None
            assert tier.sample() == []
            assert tier.seen("ag_gemm", KEY, h200) == f"oversized:{40 * 2**20}"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak  # none of the 40 MiB came over
    [message] = _messages(caplog)
    assert name in message and str(remote_values.MAX_VALUE_BYTES) in message
    assert tier.publish(entry)  # replaced, as a corrupt file is
    assert tier.fetch("ag_gemm", KEY, h200) == entry


def test_a_slots_fields_are_read_within_the_slots_budget(server, make_entry, caplog, monkeypatch):
    monkeypatch.setattr(remote_values, "SLOT_FIELDS", 2)
    tier = RemoteTier(server.url)
    for sms in (100, 110, 120):
        assert tier.publish(make_entry(fp=gpu_fingerprint("NVIDIA H100", sms=sms)))
    h200 = gpu_fingerprint()
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert tier.fetch("ag_gemm", KEY, h200, MatchPolicy.ANY) is not None
    [message] = _messages(caplog)
    assert "1 fields not read" in message
