"""What a pod has seen of the remote tier (``registry.remote.freshness``): an older signed
value replayed at its own key is refused, in memory and across a restart (the file on the
volume, bounded; a damaged one replaced); then, on a real redis-server, each family's
value: a tuned entry, a Triton pointer, a compiled model's index, a host record."""

from __future__ import annotations

import json
import logging

import pytest

from registry.remote import freshness as freshness_module
from registry.remote.freshness import FILE_NAME, Freshness
from registry.trust import signing
from registry.trust.remote_signature import Opened
from registry.trust.signing import Trust

NOW = 1_700_000_000 * 10**9  # ns: a fixed clock


def signed(payload: bytes, issued: int) -> Opened:
    return Opened(payload, issued, vouched=True)


def test_a_newer_value_replaces_and_an_older_one_is_refused():
    seen = Freshness()
    assert seen.refusal("k", "f", signed(b"a", 10)) is None
    assert seen.refusal("k", "f", signed(b"b", 20)) is None  # newer: taken
    reason = seen.refusal("k", "f", signed(b"a", 10))  # the older one, replayed
    assert reason is not None and "issued at 10 ns, not after 20 ns" in reason
    assert seen.refusal("k", "g", signed(b"a", 10)) is None  # another field: its own mark
    assert seen.refusal("other", "f", signed(b"a", 10)) is None
    assert seen.newest("k", "f") == 20


def test_the_same_time_with_other_bytes_is_refused_the_same_bytes_are_not():
    seen = Freshness()
    assert seen.refusal("k", "", signed(b"a", 10)) is None
    assert seen.refusal("k", "", signed(b"a", 10)) is None  # read again
    assert seen.refusal("k", "", signed(b"b", 10)) is not None
    # the bytes already taken, issued earlier (a pod whose clock is behind): the same use
    assert seen.refusal("k", "", signed(b"a", 5)) is None
    assert seen.newest("k") == 10


def test_an_old_envelope_is_time_0_taken_only_until_a_time_is_seen():
    seen = Freshness()
    assert seen.refusal("k", "", signed(b"old", 0)) is None
    assert seen.refusal("k", "", signed(b"older", 0)) is None  # time 0 is never a mark
    assert seen.newest("k") == 0
    assert seen.refusal("k", "", signed(b"new", 1)) is None
    assert seen.refusal("k", "", signed(b"old", 0)) is not None


def test_a_time_no_trusted_key_vouched_for_is_neither_checked_nor_noted():
    seen = Freshness()
    assert seen.refusal("k", "", Opened(b"x", 0, vouched=False)) is None
    assert seen.newest("k") == 0
    assert seen.refusal("k", "", signed(b"a", 10)) is None
    assert seen.refusal("k", "", Opened(b"b", 0, vouched=False)) is None  # unsigned: the trust
    assert seen.newest("k") == 10


def test_this_pods_value_is_issued_above_anything_seen_at_its_key():
    seen = Freshness(clock=lambda: NOW)
    assert seen.issue("k") == NOW
    seen.note("k", "", signed(b"a", NOW + 5))  # another pod's clock is ahead
    assert seen.issue("k") == NOW + 6 and seen.issue("other") == NOW
    seen.note("k", "", signed(b"b", NOW + 1))  # a note never lowers the mark
    assert seen.newest("k") == NOW + 5


def test_signatures_past_their_maximum_age_are_refused():
    seen = Freshness(max_age_s=60, clock=lambda: NOW)
    assert seen.refusal("k", "", signed(b"a", NOW - 59 * 10**9)) is None
    reason = seen.refusal("k", "", signed(b"b", NOW - 61 * 10**9))
    assert reason is not None and "expire after 60 s" in reason
    assert seen.refusal("k2", "", signed(b"old", 0)) is not None  # an old envelope: expired
    assert Freshness(clock=lambda: NOW).refusal("k", "", signed(b"b", 1)) is None  # no limit


def test_a_time_far_ahead_of_this_pods_clock_is_refused_and_never_a_mark():
    """A signer whose clock is ahead (or a compromised one) would otherwise leave marks
    that make every in-sync pod's values look old, and push ``issue`` past 64 bits."""
    seen = Freshness(clock=lambda: NOW)
    assert seen.refusal("k", "", signed(b"a", NOW + 299 * 10**9)) is None  # within 300 s
    reason = seen.refusal("k2", "", signed(b"b", 2**64 - 1))
    assert reason is not None and "ahead of this pod's clock" in reason
    seen.note("k3", "", signed(b"c", NOW + 3600 * 10**9))  # what a publish merged with
    assert seen.newest("k2") == 0 and seen.newest("k3") == 0 and seen.issue("k3") == NOW


# ---- on the volume ------------------------------------------------------------------


def test_the_marks_outlive_a_restart(tmp_path):
    path = tmp_path / FILE_NAME
    first = Freshness(path, save_every_s=0)
    assert first.refusal("k", "f", signed(b"new", 20)) is None
    restarted = Freshness(path)
    assert restarted.refusal("k", "f", signed(b"old", 10)) is not None
    assert restarted.newest("k", "f") == 20


def test_saves_wait_for_the_interval_and_a_timer_saves_a_bursts_last_marks(tmp_path):
    path, clock, scheduled = tmp_path / FILE_NAME, [0.0], []
    seen = Freshness(
        path,
        save_every_s=1.0,
        monotonic=lambda: clock[0],
        later=lambda delay, fn: scheduled.append((delay, fn)),
    )
    seen.note("k1", "", signed(b"a", 10))  # the first mark: at once
    assert Freshness(path).newest("k1") == 10 and scheduled == []
    clock[0] = 0.25
    seen.note("k2", "", signed(b"a", 10))
    seen.note("k3", "", signed(b"a", 10))
    assert Freshness(path).newest("k2") == 0  # within the interval: not yet
    assert [delay for delay, _ in scheduled] == [0.75]  # one timer for the burst
    clock[0] = 1.0
    scheduled[0][1]()  # the timer fires
    assert Freshness(path).newest("k3") == 10
    seen.note("k4", "", signed(b"a", 10))
    seen.save()  # the tier's flush, at the end of a run
    assert Freshness(path).newest("k4") == 10


def test_a_save_that_takes_long_waits_longer_for_the_next(tmp_path):
    path, clock, scheduled = tmp_path / FILE_NAME, [0.0], []

    def slow() -> float:
        clock[0] += 0.25  # every look at the clock: a save takes 0.25 s
        return clock[0]

    def later(delay, fn):
        scheduled.append(delay)

    seen = Freshness(path, save_every_s=1.0, monotonic=slow, later=later)
    seen.note("k1", "", signed(b"a", 10))
    clock[0] += 1.5  # past the interval asked for, not past ten times the save
    seen.note("k2", "", signed(b"a", 10))
    assert Freshness(path).newest("k2") == 0 and scheduled == [0.75]
    seen = Freshness(path, save_every_s=1.0, monotonic=slow, later=later)
    seen.note("k3", "", signed(b"a", 10))
    clock[0] += 3.0
    seen.note("k4", "", signed(b"a", 10))
    assert Freshness(path).newest("k4") == 10


def test_the_default_timer_saves_in_the_background(tmp_path):
    import time

    path = tmp_path / FILE_NAME
    seen = Freshness(path, save_every_s=0.05)
    seen.note("k1", "", signed(b"a", 10))
    seen.note("k2", "", signed(b"a", 10))
    deadline = time.monotonic() + 5
    while Freshness(path).newest("k2") == 0:
        assert time.monotonic() < deadline, "the timer never saved"
        time.sleep(0.02)


def test_a_process_that_ends_within_the_interval_saves_at_its_exit(tmp_path):
    import subprocess
    import sys

    path = tmp_path / FILE_NAME
    child = (
        "import sys\n"
        "from pathlib import Path\n"
        "from registry.remote.freshness import Freshness\n"
        "from registry.trust.remote_signature import Opened\n"
        "seen = Freshness(Path(sys.argv[1]), save_every_s=3600)\n"
        "for n in range(1, 4):\n"
        "    seen.note(f'k{n}', '', Opened(b'a', n, vouched=True))\n"
    )
    subprocess.run([sys.executable, "-c", child, str(path)], check=True, timeout=60)
    assert Freshness(path).newest("k3") == 3  # the last marks: saved at exit, not lost


def test_the_file_holds_at_most_its_bound_the_oldest_dropped(tmp_path):
    path = tmp_path / FILE_NAME
    seen = Freshness(path, most=3, save_every_s=0)
    for n in range(1, 6):
        seen.note(f"k{n}", "", signed(b"a", n))
    seen.save()
    assert len(seen) == 3 and seen.newest("k1") == 0 and seen.newest("k5") == 5
    assert len(json.loads(path.read_text())["seen"]) == 3
    assert len(Freshness(path, most=2)) == 2  # a smaller bound when read: the newest kept
    assert Freshness(path, most=2).newest("k3") == 0


def test_two_processes_of_a_pod_merge_their_marks(tmp_path):
    path = tmp_path / FILE_NAME
    one, two = Freshness(path, save_every_s=0), Freshness(path, save_every_s=0)
    one.note("a", "", signed(b"x", 10))
    two.note("b", "", signed(b"x", 20))
    two.note("a", "", signed(b"y", 5))  # older than one's: one's mark stays
    merged = Freshness(path)
    assert (merged.newest("a"), merged.newest("b")) == (10, 20)


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"version": 1, "seen": {"zz": "1 0123456789abcdef"}}', b"[]", b"x" * 64],
    ids=["not-json", "bad-mark", "not-an-object", "too-big"],
)
def test_a_damaged_file_is_warned_about_once_and_replaced(tmp_path, caplog, monkeypatch, content):
    monkeypatch.setattr(freshness_module, "MAX_FILE_BYTES", 32)  # "too-big" is over it
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="registry.remote.freshness"):
        seen = Freshness(path, save_every_s=0)
    assert len(seen) == 0
    assert [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()] == [
        r.getMessage() for r in caplog.records
    ]
    assert len(caplog.records) == 1 and "starting with no values seen" in caplog.text
    seen.note("k", "", signed(b"a", 1))
    assert json.loads(path.read_bytes())["seen"]  # replaced by one that reads


def test_a_missing_folder_keeps_the_marks_in_memory(tmp_path):
    path = tmp_path / "no-volume" / FILE_NAME
    seen = Freshness(path, save_every_s=0)
    seen.note("k", "", signed(b"a", 1))
    seen.save()
    assert not path.parent.exists() and seen.newest("k") == 1  # no volume made here


# ---- on a real redis-server: each family's value replayed at its own key ---------------

KERNEL_KEY = {"M": 64, "N": 32, "K": 32}
TRITON_KEY = "CZ4VKGKEWFV6MYQ5X5TRDJHUJU3GNRTX4GLYL7SUUERN3NQAXEGA"


@pytest.fixture
def fleet(tmp_path):
    """The fleet's key: every pod signs with it and trusts it."""
    private, _ = signing.generate(tmp_path / "fleet", "fleet")
    return Trust.load(private.parent, signing_key=private)


def pod(url, trust, volume=None):
    """A pod's tier; ``volume``: its folder, where what it has seen persists."""
    from registry.remote.tier import RemoteTier

    if volume is not None:
        volume.mkdir(exist_ok=True)  # a volume is made by the run, never by the tier
    path = None if volume is None else volume / FILE_NAME
    return RemoteTier(url, timeout_s=0.5, trust=trust, freshness=Freshness(path, save_every_s=0))


def _entries():
    from registry import Entry, KernelConfig, cpu_fingerprint

    return [
        Entry.make("ag_gemm", KERNEL_KEY, cpu_fingerprint(), KernelConfig.make({"BLOCK_M": m}))
        for m in (16, 32, 64)
    ]


def test_an_older_entry_replayed_at_its_field_is_refused_across_a_restart(
    tmp_path, server, fleet, caplog
):
    from registry import cpu_fingerprint
    from registry.remote.tier import slot_name

    first, second, third = _entries()
    name, field = slot_name(first.kernel, first.key_json), first.fingerprint.digest()
    publisher = pod(server.url, fleet)
    assert publisher.publish(first)
    old = server.client.hget(name, field)
    server.client.hdel(name, field)  # the fleet withdraws it: a newer entry replaces it
    assert publisher.publish(second)
    reader = pod(server.url, fleet, tmp_path / "volume")
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == second
    server.client.hset(name, field, old)  # replayed by anyone who can write to redis
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) is None
    assert reader.stats.refused == 1
    assert f"{name} field {field[:12]}: refused: issued at" in caplog.text
    restarted = pod(server.url, fleet, tmp_path / "volume")  # a new process, the same volume
    assert restarted.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) is None
    assert restarted.stats.refused == 1
    assert pod(server.url, fleet).fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == first
    # a publish replaces the replay (never merged with it) and goes above it
    assert publisher.publish(third)
    assert restarted.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == third
    assert restarted.stats.refused == 1


def test_the_refusing_pods_own_publish_never_signs_the_replay_anew(tmp_path, server, fleet):
    """The miss a refused replay makes is tuned and published, fenced on the replay: the
    replay is replaced, not merged (a merge keeps the earliest tuning: the replayed one,
    signed again with a new time, would win for every pod)."""
    from registry import cpu_fingerprint
    from registry.remote.tier import slot_name

    first, second, third = _entries()
    name, field = slot_name(first.kernel, first.key_json), first.fingerprint.digest()
    publisher = pod(server.url, fleet)
    assert publisher.publish(first)
    old = server.client.hget(name, field)
    server.client.hdel(name, field)  # the fleet withdraws it
    assert publisher.publish(second)
    reader = pod(server.url, fleet, tmp_path / "volume")
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == second
    server.client.hset(name, field, old)  # replayed
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) is None  # a miss: tuned
    seen = reader.seen("ag_gemm", KERNEL_KEY, cpu_fingerprint())
    assert reader.publish(third, seen=seen)
    got = pod(server.url, fleet).fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint())
    assert got is not None and got.best == third.best != first.best
    assert reader.stats.refused == 2  # the fetch's and the fence's


def test_an_entry_in_the_old_envelope_is_time_0(tmp_path, server, fleet, make_entry):
    from registry import cpu_fingerprint
    from registry.core import atomic
    from registry.remote.tier import slot_name
    from tests.registry.trust.test_remote_signature import _old_envelope

    first, second, _ = _entries()
    name, field = slot_name(first.kernel, first.key_json), first.fingerprint.digest()
    old = _old_envelope(fleet.signer, name, field, atomic.dumps(first.to_json()).encode())
    server.client.hset(name, field, old)
    reader = pod(server.url, fleet)
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == first  # still opens
    server.client.hdel(name, field)
    assert pod(server.url, fleet).publish(second)
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == second
    server.client.hset(name, field, old)
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) is None  # never newer


def test_an_older_triton_pointer_replayed_at_its_name_is_refused(tmp_path, server, fleet):
    from registry.remote import triton as remote_triton

    name = remote_triton.name_key(TRITON_KEY, "k.cubin")
    old_cubin, new_cubin = b"\x7fELF old" * 16, b"\x7fELF new" * 16
    publisher = pod(server.url, fleet)
    assert remote_triton.publish(publisher, TRITON_KEY, "k.cubin", old_cubin)
    old = server.client.get(name)
    assert remote_triton.publish(publisher, TRITON_KEY, "k.cubin", new_cubin)
    reader = pod(server.url, fleet, tmp_path / "volume")
    assert remote_triton.fetch(reader, TRITON_KEY, ["k.cubin"]) == {"k.cubin": new_cubin}
    server.client.set(name, old)  # its blob is still there: a whole, signed, older file
    assert remote_triton.fetch(reader, TRITON_KEY, ["k.cubin"]) == {}
    assert reader.stats.refused == 1
    restarted = pod(server.url, fleet, tmp_path / "volume")
    assert remote_triton.fetch(restarted, TRITON_KEY, ["k.cubin"]) == {}
    assert remote_triton.fetch(pod(server.url, fleet), TRITON_KEY, ["k.cubin"]) == {
        "k.cubin": old_cubin
    }  # a pod that never saw the newer one: what the memory is for


def test_an_older_model_index_replayed_at_its_key_is_refused(tmp_path, server, fleet):
    from registry.core.fingerprint import cpu_fingerprint
    from registry.remote import models as remote_models
    from tests.registry.families.test_bundle_indexed import FILES, family

    where = {"model": "mlp", "key_digest": "0123456789abcdef", "fingerprint": cpu_fingerprint()}
    name = remote_models.index_key(**where)
    publisher = pod(server.url, fleet)
    assert remote_models.publish(publisher, family(tmp_path / "a"), **where)
    old = server.client.get(name)
    newer = family(tmp_path / "b", {**FILES, "fxgraph/ab/fabc/entry": b"graph, recompiled"})
    assert remote_models.publish(publisher, newer, **where)
    reader = pod(server.url, fleet, tmp_path / "volume")
    assert remote_models.fetch(reader, tmp_path / "r1", **where)
    server.client.set(name, old)
    assert not remote_models.fetch(reader, tmp_path / "r2", **where)
    assert reader.stats.refused == 1
    restarted = pod(server.url, fleet, tmp_path / "volume")
    assert not remote_models.fetch(restarted, tmp_path / "r3", **where)
    assert remote_models.publish(publisher, newer, **where)  # republished: newer again
    assert remote_models.fetch(restarted, tmp_path / "r4", **where)


def test_an_older_host_record_replayed_is_not_used(tmp_path, server, fleet):
    from dataclasses import replace

    from registry.core.fingerprint import cpu_fingerprint
    from registry.storage import hosts

    found = hosts.probe("cpu", 0)
    record = hosts.HostRecord(probe=found.to_json(), fingerprint=cpu_fingerprint())
    publisher = pod(server.url, fleet)
    assert hosts.publish_record(publisher, found, record)
    old = server.client.get(hosts.remote_key(found))
    assert hosts.publish_record(publisher, found, replace(record, kernel_hashes={"k": "1"}))
    reader = pod(server.url, fleet)
    assert hosts.fetch_record(reader, found).kernel_hashes == {"k": "1"}
    server.client.set(hosts.remote_key(found), old)
    assert hosts.fetch_record(reader, found) is None and reader.stats.refused == 1
