"""The harvest's queue: each entry once, oldest first, bounded, at most so many a
minute; the watched folders' save due once they are quiet."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from warmup.sidecar import harvest_queue
from warmup.sidecar.harvest_queue import FOLDERS, HarvestQueue


def queue(dropped=None, **limits) -> HarvestQueue:
    bounds = {"max_per_minute": 100, "max_pending": 10, **limits}
    return HarvestQueue(**bounds, folders=Path("/inductor"), dropped=dropped or (lambda k: None))


def test_entries_leave_once_each_oldest_first():
    q = queue()
    q.offer("kernel", Path("/a"))
    q.offer("stub", Path("/b"))
    q.offer("kernel", Path("/a"))  # a second event of one entry
    assert q.pending() == [("kernel", "/a"), ("stub", "/b")]
    assert [q.next(), q.next()] == [("kernel", Path("/a")), ("stub", Path("/b"))]
    assert q.idle()


def test_past_the_bound_an_entry_is_dropped_and_told():
    dropped: list[str] = []
    q = queue(dropped.append, max_pending=2)
    for i in range(4):
        q.offer("kernel", Path(f"/k{i}"))
    assert dropped == ["kernel", "kernel"] and len(q.pending()) == 2


def test_the_rate_holds_an_entry_until_the_minute_allows_it():
    q = queue(max_per_minute=1)
    q.offer("kernel", Path("/a"))
    q.offer("kernel", Path("/b"))
    assert q.next() == ("kernel", Path("/a"))
    q.spent()
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.next()))
    worker.start()
    time.sleep(0.3)
    assert got == [] and q.pending() == [("kernel", "/b")]  # waits for the minute
    q.stop()
    worker.join(2)
    assert got == [None]


def test_the_folders_are_due_once_quiet(monkeypatch):
    monkeypatch.setattr(harvest_queue, "INDUCTOR_QUIET_S", 0.2)
    q = queue()
    started = time.monotonic()
    q.offer(FOLDERS, Path("/engine"))
    assert not q.idle() and q.pending() == []
    assert q.next() == (FOLDERS, Path("/inductor"))
    assert time.monotonic() - started >= 0.2
    assert q.idle()


@pytest.mark.parametrize("events", [1, 3])
def test_the_folders_are_saved_once_for_a_burst(monkeypatch, events):
    monkeypatch.setattr(harvest_queue, "INDUCTOR_QUIET_S", 0.05)
    q = queue()
    for _ in range(events):
        q.offer(FOLDERS, Path("/engine"))
    assert q.next() == (FOLDERS, Path("/inductor"))
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.next()))
    worker.start()
    time.sleep(0.2)
    q.stop()
    worker.join(2)
    assert got == [None]  # nothing more was due
