"""The remote tier's calls (``registry.remote.calls``) on a real redis-server, through the
outage tests' TCP proxy: each within its deadline, an outage one warning and then a skip
until the retry, a lookup asked now made inside the skip."""

from __future__ import annotations

import logging
import time

import pytest

from registry.remote.calls import WarnOnce
from registry.remote.tier import RemoteTier
from tests.registry._trickle import trickling, within
from tests.registry.remote.test_tier import KEY, RETRY_S, _messages


def test_an_outage_is_one_warning_then_skipped_until_the_retry(proxy, make_entry, h200, caplog):
    entry = make_entry()
    tier = RemoteTier(proxy.url, timeout_s=0.5, retry_after_s=RETRY_S)
    assert tier.publish(entry)
    proxy.down()
    with caplog.at_level(logging.INFO, logger="registry.remote.tier"):
        assert tier.fetch("ag_gemm", KEY, h200) is None
        assert not tier.up
        started = time.monotonic()
        for _ in range(100):  # skipped: no network
            assert tier.fetch("ag_gemm", KEY, h200) is None
            assert not tier.publish(entry)
        assert time.monotonic() - started < 0.05
        assert (tier.stats.errors, tier.stats.skipped) == (1, 200)
        time.sleep(RETRY_S)
        assert tier.fetch("ag_gemm", KEY, h200) is None  # tried again: still down
        assert tier.stats.errors == 2
        proxy.up()
        time.sleep(RETRY_S)
        assert tier.up and tier.fetch("ag_gemm", KEY, h200) == entry
    warnings = _messages(caplog)
    assert len(warnings) == 1  # one per outage
    assert warnings[0] == (
        f"registry remote tier redis at {proxy.url} unreachable (Connection refused): "
        f"using the local tier only; retrying in {RETRY_S:g} s"
    )
    (recovered,) = _messages(caplog, logging.INFO)
    assert "answers again" in recovered


def test_a_lookup_asked_now_is_made_inside_the_skip(proxy, server, make_entry, h200):
    # before a tuning: another pod may have published the entry during the blip
    tier = RemoteTier(proxy.url, timeout_s=0.5, retry_after_s=600)
    proxy.down()
    assert tier.fetch("ag_gemm", KEY, h200) is None and not tier.up
    proxy.up()
    entry = make_entry()
    RemoteTier(server.url).publish(entry)
    assert tier.fetch("ag_gemm", KEY, h200) is None  # skipped
    assert tier.fetch("ag_gemm", KEY, h200, now=True) == entry
    assert tier.up and tier.publish(make_entry(8))  # it answered: no longer skipped


@pytest.mark.parametrize("call", ["fetch", "publish"])
def test_a_hung_server_stalls_a_call_no_longer_than_the_timeout(proxy, make_entry, h200, call):
    entry = make_entry()
    tier = RemoteTier(proxy.url, timeout_s=0.3, retry_after_s=RETRY_S)
    assert tier.publish(entry)  # a pooled connection, open when the server hangs
    proxy.stall()
    started = time.monotonic()
    got = tier.fetch("ag_gemm", KEY, h200) if call == "fetch" else tier.publish(entry)
    assert not got and time.monotonic() - started < 1.0
    assert tier.stats.errors == 1 and not tier.up


def test_the_password_is_never_logged(make_entry, h200, caplog):
    from tests.conftest import free_port

    tier = RemoteTier(f"redis://:hunter2@127.0.0.1:{free_port()}/0", timeout_s=0.3)
    with caplog.at_level(logging.DEBUG, logger="registry.remote.tier"):
        assert tier.fetch("ag_gemm", KEY, h200) is None
        assert not tier.publish(make_entry())  # skipped
    assert "hunter2" not in caplog.text and "hunter2" not in tier.describe()
    assert ":***@" in tier.describe() and "***" in caplog.text


@pytest.mark.parametrize("kind", ["tcp", "unix", "tls"])
def test_a_trickling_server_is_an_outage_within_the_deadline(tmp_path, kind, make_entry, h200):
    with trickling(kind, tmp_path) as hostile:
        tier = RemoteTier(hostile.url, timeout_s=1.0, retry_after_s=0.0)
        with within(1.5):
            assert tier.fetch("ag_gemm", KEY, h200, now=True) is None
        with within(1.5):
            assert not tier.publish(make_entry())
        with within(1.5):
            assert tier.seen("ag_gemm", KEY, h200) == ""
        with within(1.5):
            assert tier.sample() == []
        with within(1.5):
            assert tier.flush() == 1
    assert tier.stats.errors == 5


def test_a_warning_about_a_key_and_field_is_said_once(caplog):
    warn = WarnOnce()
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        for _ in range(3):
            warn("slot", "f" * 64, "skipping %s", "it")
        warn("slot", "", "not a hash")
    assert _messages(caplog) == [
        "remote tier: slot field ffffffffffff: skipping it",
        "remote tier: slot: not a hash",
    ]
