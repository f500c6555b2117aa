"""The remote tier's publish queue (``registry.remote.publish``) on a fake transport and
fence: the newest entry of a field kept, drained until a publish fails, an entry another
pod published first dropped, ``flush`` trying now and counting what is left."""

from __future__ import annotations

import logging

import redis

from registry.core.errors import Superseded
from registry.remote.calls import RemoteStats, WarnOnce
from registry.remote.publish import PublishQueue
from registry.remote.transport import Transport


class FakeFence:
    """Publishes what it is given; ``refuse``: those it raises Superseded for; ``down``:
    fails as a dead server."""

    def __init__(self) -> None:
        self.published: list = []
        self.refuse: set[int] = set()
        self.down = False

    def publish(self, client, entry, seen=None) -> bool:
        if self.down:
            raise redis.exceptions.ConnectionError("Connection refused")
        if id(entry) in self.refuse:
            raise Superseded("slot field", held=None)
        self.published.append((entry, seen))
        return True


def _queue(retry_after_s: float = 600) -> tuple[PublishQueue, FakeFence]:
    transport = Transport(
        "redis://h:6379/0", RemoteStats(), WarnOnce(), retry_after_s=retry_after_s, client=object()
    )
    fence = FakeFence()
    queue = PublishQueue(transport, fence)  # type: ignore[arg-type]
    transport.on_answer = queue.drain
    return queue, fence


def test_the_newest_entry_of_a_field_is_kept(make_entry):
    queue, fence = _queue()
    first, newer, other = make_entry(), make_entry(block_m=256), make_entry(8)
    queue.keep(first, "a")
    queue.keep(newer, "b")
    queue.keep(other, None)
    assert len(queue) == 2
    queue.drain()
    assert fence.published == [(newer, "b"), (other, None)] and len(queue) == 0


def test_a_drain_stops_at_the_first_failure_and_keeps_the_rest(make_entry):
    queue, fence = _queue()
    queue.keep(make_entry(), None)
    queue.keep(make_entry(8), None)
    fence.down = True
    queue.drain()
    assert len(queue) == 2 and not queue.transport.calls.up
    assert queue.transport.calls.stats.errors == 1  # one call, then it stopped
    fence.down = False
    queue.transport.answered()  # any answer of the tier drains it
    assert len(queue) == 0 and len(fence.published) == 2


def test_an_entry_another_pod_published_first_is_dropped(make_entry):
    queue, fence = _queue()
    refused, kept = make_entry(), make_entry(8)
    fence.refuse.add(id(refused))
    queue.keep(refused, "")
    queue.keep(kept, "")
    queue.drain()
    assert len(queue) == 0 and fence.published == [(kept, "")]


def test_flush_tries_now_and_warns_of_what_is_left(make_entry, caplog):
    queue, fence = _queue()
    queue.keep(make_entry(), None)
    fence.down = True
    queue.drain()  # the tier is now skipped for 600 s
    with caplog.at_level(logging.WARNING, logger="registry.remote.tier"):
        assert queue.flush() == 1
    assert "1 tuned entries not published" in caplog.text
    fence.down = False
    assert queue.flush() == 0 and len(fence.published) == 1  # no wait for the skip
    assert queue.transport.calls.up
