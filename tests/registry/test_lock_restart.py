"""A redis lock server restarted empty while a holder works under its lock: the holder
stops at its next checkpoint before a waiter gets the lock (the restart grace,
``registry.locks.redis_lock``), and a holder past its last checkpoint that puts anyway is
fenced: no write of the old holder lands after the new holder's."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import pytest

from registry import Store
from registry.core.errors import Superseded
from registry.locks import LockLost, backend_from_url, lock
from registry.locks.redis_lock import RENEW_MAX_S
from registry.remote.tier import RemoteTier
from registry.remote.tiered import TieredStore
from tests.registry.test_lock_chaos import Server

NAME = "tune/restart"
TTL_S = 60.0  # the product's default: renewed every RENEW_MAX_S, not every 6 s
KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}
STEP_S = 0.02  # the holder's work between two checkpoints


NEW_ONLY = {64, 32, 512}  # make_entry(block_m=64)'s measurements; block_m=32's add 16


def _blocks(entry) -> set[int]:
    return {m.config.meta["BLOCK_M"] for m in entry.measurements}


@pytest.fixture
def server(restartable_server):
    """This module's redis-server, which its tests kill and restart (conftest's)."""
    return restartable_server


@dataclass
class Race:
    """What happened, in seconds after the restarted server answered (``up``)."""

    up: float = 0.0
    lost_at: float | None = None  # the holder saw the loss (its warning)
    stopped_at: float | None = None  # the holder's work stopped (LockLost at a checkpoint)
    acquired_at: float | None = None  # the waiter got the lock
    old_put: str | None = None  # "landed" or "superseded": the old holder's put, if any
    holding: threading.Event = field(default_factory=threading.Event)
    new_put: threading.Event = field(default_factory=threading.Event)  # B's put is done

    def after_up(self, at: float | None) -> float | None:
        return None if at is None else at - self.up


def _race(server: Server, old: Store | TieredStore, new: Store | TieredStore, make, *, checks):
    """Pod A holds the lock and works in steps (checking it when ``checks``, else going on
    past the restart, as work after its last checkpoint does), then puts with its fence;
    pod B waits for the lock, then puts with its own. The server restarts empty while A
    works, at any phase of A's heartbeat."""
    race = Race()
    work_s = 3.0 + RENEW_MAX_S  # past the restart grace: B gets in while A still works

    def pod_a() -> None:
        with lock(NAME, ttl=TTL_S, timeout=10, backend=backend_from_url(server.url)) as me:
            fence = old.fence("ag_gemm", KEY, make().fingerprint)
            race.holding.set()
            try:
                end = time.monotonic() + work_s
                while time.monotonic() < end:
                    if checks:
                        me.check()
                    time.sleep(STEP_S)
            except LockLost:
                race.stopped_at = time.monotonic()
                assert me.lease is not None
                race.lost_at = me.lease.lost_at
                return
            if not checks:  # its work outlasts B's, however slow the machine: B puts first
                race.new_put.wait(30)
            try:
                old.put(make(block_m=32), fence=fence)
                race.old_put = "landed"
            except Superseded:
                race.old_put = "superseded"

    def pod_b() -> None:
        race.holding.wait(10)
        with lock(NAME, ttl=TTL_S, timeout=30, backend=backend_from_url(server.url)):
            race.acquired_at = time.monotonic()
            new.put(make(block_m=64), fence=new.fence("ag_gemm", KEY, make().fingerprint))
            race.new_put.set()

    threads = [threading.Thread(target=pod_a), threading.Thread(target=pod_b)]
    threads[0].start()
    assert race.holding.wait(10)
    threads[1].start()
    time.sleep(0.2 + random.uniform(0, RENEW_MAX_S))  # any phase of the heartbeat
    server.restart(persisted=False)
    race.up = time.monotonic()
    for t in threads:
        t.join(30)
    return race


@pytest.mark.slow
def test_a_holder_stops_at_a_restart_before_a_waiter_gets_the_lock(server, tmp_path, make_entry):
    races = []
    for _ in range(3):
        server.client.flushall()
        store = Store(tmp_path / f"volume-{len(races)}", create=True)
        races.append(_race(server, store, store, make_entry, checks=True))
    for race in races:
        assert race.stopped_at is not None and race.lost_at is not None, "never stopped"
        assert race.acquired_at is not None and race.stopped_at <= race.acquired_at
        assert race.old_put is None  # the old holder wrote nothing
    for i in range(3):
        (entry,) = Store(tmp_path / f"volume-{i}").entries()
        assert entry.best.meta["BLOCK_M"] == 64  # the new holder's
    print(
        "restart empty, ttl 60 s, after the server answered again: "
        + "; ".join(
            f"loss seen {r.after_up(r.lost_at):.3f} s, stopped {r.after_up(r.stopped_at):.3f} s"
            f" (loss to stop {r.stopped_at - r.lost_at:.3f} s), waiter in "
            f"{r.after_up(r.acquired_at):.3f} s"
            for r in races
            if r.stopped_at is not None and r.lost_at is not None and r.acquired_at is not None
        )
    )


@pytest.mark.slow
def test_a_holder_past_its_checkpoints_is_fenced_after_a_restart(server, tmp_path, make_entry):
    # both pods share the volume: the old holder's put comes after the new holder's
    store = Store(tmp_path / "volume", create=True)
    race = _race(server, store, store, make_entry, checks=False)
    assert race.acquired_at is not None and race.old_put == "superseded"
    (entry,) = Store(tmp_path / "volume").entries()
    assert _blocks(entry) == NEW_ONLY  # the new holder's alone: no BLOCK_M 16 of the old's


@pytest.mark.slow
def test_a_publish_past_its_checkpoints_is_fenced_on_the_restarted_server(
    server, tmp_path, make_entry
):
    # pods on two nodes share only the restarted redis: its field keeps the new holder's
    def pod(name: str) -> TieredStore:
        return TieredStore(Store(tmp_path / name, create=True), RemoteTier(server.url))

    race = _race(server, pod("a"), pod("b"), make_entry, checks=False)
    assert race.old_put == "superseded"
    fetched = RemoteTier(server.url).fetch("ag_gemm", KEY, make_entry().fingerprint)
    assert fetched is not None
    assert _blocks(fetched) == NEW_ONLY
    (kept,) = Store(tmp_path / "a").entries()  # pod A files the fleet's entry
    assert kept.best.meta["BLOCK_M"] == 64


def test_no_lock_is_given_on_a_server_that_just_started(server, tmp_path):
    backend = backend_from_url(server.url)
    server.restart(persisted=False, down_s=0.0)
    started = time.monotonic()
    with lock(NAME, ttl=TTL_S, timeout=10, backend=backend):
        waited = time.monotonic() - started
    grace = backend.restart_grace_s  # type: ignore[attr-defined]
    assert grace - 1 <= waited < grace + 1  # INFO's uptime counts whole seconds
    # a second lock on the same server, now old enough, is given at once
    started = time.monotonic()
    with lock(NAME + "/2", ttl=TTL_S, timeout=10, backend=backend):
        assert time.monotonic() - started < 0.5


def test_a_server_that_refuses_info_gives_locks_at_once_and_says_so(server, caplog):
    import redis

    backend = backend_from_url(server.url)
    server.restart(persisted=False, down_s=0.0)

    def refused(*args, **kwargs):
        raise redis.exceptions.ResponseError("NOPERM this user has no permissions to run 'info'")

    backend.client.info = refused  # type: ignore[attr-defined]
    started = time.monotonic()
    with lock(NAME, ttl=TTL_S, timeout=10, backend=backend):
        assert time.monotonic() - started < 0.5
    assert backend.restart_grace_s == 0  # type: ignore[attr-defined]
    assert any("refuses INFO" in r.getMessage() for r in caplog.records)
