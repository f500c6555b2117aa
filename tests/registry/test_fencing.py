"""Fences: of the holders of a shape's lock, old or new, only the first put lands."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from registry import RegistryError, Store, cpu_fingerprint
from registry.core import atomic
from registry.core.errors import Superseded
from registry.locks import backend_from_url
from registry.remote.tier import RemoteTier
from registry.remote.tiered import TieredStore
from registry.storage.store import CURRENT, QUARANTINE
from tests.warmup.tuning.fakes import FakeTask, fake_timer
from warmup.tuning.tuner import TuneOptions, Tuner

KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}


def _fence(store, fp):
    return store.fence("ag_gemm", KEY, fp)


def test_of_two_holders_that_looked_first_only_the_first_put_lands(tmp_path, make_entry, h200):
    old, new = Store(tmp_path), Store(tmp_path)  # a holder that lost its lock, its successor
    old_fence, new_fence = _fence(old, h200), _fence(new, h200)
    assert old_fence == new_fence and old_fence.seen == ""  # nothing stored yet
    first = new.put(make_entry(block_m=64), fence=new_fence)
    path = tmp_path / CURRENT / first.relpath()
    held = path.read_bytes()
    with pytest.raises(Superseded, match="changed since this writer looked"):
        old.put(make_entry(block_m=32), fence=old_fence)
    assert path.read_bytes() == held  # nothing written, nothing merged
    assert Store(tmp_path).lookup("ag_gemm", KEY, h200) == first
    later = _fence(old, h200)  # one that looks after the put finds the entry
    assert later.seen != "" and old.lookup("ag_gemm", KEY, h200) == first


def test_a_fence_sees_any_writer_and_no_generation_swap(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    store.put(make_entry(block_m=64))
    fence = _fence(store, h200)
    store.install([make_entry(m=1)], record={"bundle": {"name": "other shape"}})
    store.put(make_entry(block_m=32), fence=fence)  # a new generation, the same bytes
    fence = _fence(store, h200)
    store.install([make_entry(block_m=16)], record={"bundle": {"name": "this shape"}})
    with pytest.raises(Superseded):
        store.put(make_entry(block_m=8), fence=fence)


def test_a_lookup_after_a_fence_sees_what_the_fence_saw(tmp_path, make_entry, h200):
    # a put replaces the entry, then the .stamp that tells readers to reload: a fence
    # taken between the two must not be followed by a lookup that misses the entry
    reader = Store(tmp_path, check_interval=3600)
    reader.put(make_entry(m=1))
    assert reader.lookup("ag_gemm", KEY, h200) is None
    stored = make_entry()
    path = tmp_path / CURRENT / stored.relpath()
    atomic.write_json(path, stored.to_json())  # the stamp not yet replaced
    fence = _fence(reader, h200)
    assert fence.seen != "" and reader.lookup("ag_gemm", KEY, h200) == stored


def test_a_fence_guards_a_put_of_its_own_entry_alone(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    with pytest.raises(RegistryError, match="guards a put of that entry alone"):
        store.put(make_entry(m=1), fence=_fence(store, h200))


def test_a_folder_where_the_fenced_entry_belongs_is_quarantined_and_the_put_lands(
    tmp_path, make_entry, h200
):
    store = Store(tmp_path)
    store.put(make_entry(m=1))
    spot = tmp_path / os.readlink(tmp_path / CURRENT) / make_entry().relpath()
    spot.mkdir(parents=True)
    fence = _fence(store, h200)
    assert fence.seen.startswith("no entry")
    stored = store.put(make_entry(), fence=fence)
    assert Store(tmp_path).lookup("ag_gemm", KEY, h200) == stored
    assert list((tmp_path / QUARANTINE).glob("*.reason"))


def test_a_fenced_publish_is_refused_once_another_pod_published(server, make_entry, h200):
    mine, theirs = RemoteTier(server.url), RemoteTier(server.url)
    seen = mine.seen("ag_gemm", KEY, h200)
    assert seen == "" and theirs.seen("ag_gemm", KEY, h200) == ""
    assert theirs.publish(make_entry(block_m=64), seen=seen)
    assert not mine.publish(make_entry(block_m=32), seen=seen)
    assert mine.stats.superseded == 1
    assert mine.fetch("ag_gemm", KEY, h200).best.meta["BLOCK_M"] == 64
    again = mine.seen("ag_gemm", KEY, h200)
    assert again != "" and mine.publish(make_entry(block_m=32), seen=again)  # merged now


def test_a_fenced_publish_kept_back_in_an_outage_is_refused_when_it_comes_late(
    proxy, make_entry, h200
):
    mine, theirs = RemoteTier(proxy.url, timeout_s=0.2), RemoteTier(proxy.url)
    seen = mine.seen("ag_gemm", KEY, h200)
    proxy.down()
    assert not mine.publish(make_entry(block_m=32), seen=seen) and mine.unpublished == 1
    proxy.up()
    assert theirs.publish(make_entry(block_m=64))
    assert mine.flush() == 0 and mine.stats.superseded == 1
    assert theirs.fetch("ag_gemm", KEY, h200).best.meta["BLOCK_M"] == 64


def test_a_tiered_put_refused_locally_publishes_nothing(server, tmp_path, make_entry, h200):
    mine = TieredStore(Store(tmp_path / "volume", create=True), RemoteTier(server.url))
    theirs = TieredStore(Store(tmp_path / "volume", create=True), RemoteTier(server.url))
    fence = mine.fence("ag_gemm", KEY, h200)
    theirs.put(make_entry(block_m=64), fence=theirs.fence("ag_gemm", KEY, h200))
    with pytest.raises(Superseded):
        mine.put(make_entry(block_m=32), fence=fence)
    assert mine.remote.stats.published == 0


def _tuner(root, task, lock_url, **options):
    return Tuner(
        Store(root, create=True),
        cpu_fingerprint(),
        timer=fake_timer(task),
        lock_backend=backend_from_url(lock_url),
        options=TuneOptions(parallel_compile=False, **options),
    )


def test_a_holder_whose_shape_another_stored_meanwhile_uses_that_entry(tmp_path):
    # another holder (the lock lost to a redis restart) stores the shape while this one tunes
    task = FakeTask({16: 1.0, 32: 0.5, 64: 0.7})
    tuner = _tuner(tmp_path / "registry", task, str(tmp_path / "locks"))
    tuned = tuner.tune

    def tune_while_another_stores(t, **kw):
        other = FakeTask({16: 0.2, 32: 0.5, 64: 0.7})  # measured otherwise: 16 wins there
        rival = _tuner(tmp_path / "registry", other, str(tmp_path / "other-locks"))
        assert rival.get(other).source == "tuned"
        return tuned(t, **kw)

    tuner.tune = tune_while_another_stores
    outcome = tuner.get(task)
    assert outcome.superseded and outcome.config.meta["BLOCK"] == 16
    assert outcome.entry.best.meta["BLOCK"] == 16 and tuner.stats.superseded == 1
    stored = Store(tmp_path / "registry").entries()
    assert len(stored) == 1 and {m.config.meta["BLOCK"] for m in stored[0].measurements} == {
        16,
        32,
        64,
    }
    assert stored[0].measurements[0].median_ms == 0.2  # the other holder's alone


def test_pods_tuning_one_shape_without_a_lock_server_store_it_once(tmp_path):
    # no lock server at all: both tune at once; the first put lands, the other uses it
    url = "redis://127.0.0.1:1/0"  # nothing listens there
    both_tuning = threading.Barrier(2, timeout=30)
    outcomes = {}

    class Meeting(FakeTask):
        def run(self, config):
            if self.launches == 0:
                both_tuning.wait()
            return super().run(config)

    def pod(name, block_fastest):
        timings = {16: 1.0, 32: 1.0, 64: 1.0, block_fastest: 0.5}
        task = Meeting(timings, sleep_s=0.01 if name == "a" else 0.05)
        tuner = _tuner(tmp_path / "registry", task, url, lock_outage_s=0.0)
        outcomes[name] = (tuner.get(task), tuner.stats)

    threads = [threading.Thread(target=pod, args=a) for a in (("a", 16), ("b", 64))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    (a, a_stats), (b, b_stats) = outcomes["a"], outcomes["b"]
    assert a.unlocked and b.unlocked
    assert (a.superseded, b.superseded) == (False, True)  # a tunes faster: it stores first
    assert a.config.meta["BLOCK"] == b.config.meta["BLOCK"] == 16
    assert (a_stats.superseded, b_stats.superseded) == (0, 1)
    (stored,) = Store(tmp_path / "registry").entries()
    assert stored.best.meta["BLOCK"] == 16 and stored == a.entry == b.entry


def test_a_fence_in_the_tiers_skip_costs_no_call_and_refuses_a_field_filled_meanwhile(
    proxy, make_entry, h200
):
    mine, theirs = RemoteTier(proxy.url, timeout_s=0.2), RemoteTier(proxy.url)
    proxy.down()
    assert mine.fetch("ag_gemm", KEY, h200) is None and not mine.up  # failed: skipped now
    proxy.up()
    calls = dataclasses.replace(mine.stats)
    assert mine.seen("ag_gemm", KEY, h200) == ""  # in the skip: empty, and no call made
    assert mine.stats == calls
    published = make_entry(block_m=64)
    assert theirs.publish(published)  # another pod publishes meanwhile
    assert not mine.publish(make_entry(block_m=32), seen="")  # kept back with its fence
    assert mine.flush() == 0  # tried at the end, fenced: refused, dropped
    assert mine.stats.superseded == 1
    assert theirs.fetch("ag_gemm", KEY, h200) == published


def test_a_field_fenced_while_redis_did_not_answer_takes_no_second_tuning(
    proxy, tmp_path, make_entry, h200
):
    # pods that share only redis: B fences while redis restarts, A publishes first
    a = TieredStore(Store(tmp_path / "a", create=True), RemoteTier(proxy.url, timeout_s=0.2))
    b = TieredStore(Store(tmp_path / "b", create=True), RemoteTier(proxy.url, timeout_s=0.2))
    a_fence = a.fence("ag_gemm", KEY, h200)
    proxy.down()
    b_fence = b.fence("ag_gemm", KEY, h200)
    assert b_fence.remote == ""  # not answered: fenced as empty, never unfenced
    proxy.up()
    landed = a.put(make_entry(block_m=64), fence=a_fence)
    b.put(make_entry(block_m=32), fence=b_fence)  # B's tier is skipped: kept back
    assert b.remote.flush() == 0
    assert a.remote.fetch("ag_gemm", KEY, h200) == landed  # one tuning in redis
    assert b.remote.stats.superseded == 1


def test_a_fenced_publish_while_redis_answers_takes_the_entry_published_first(
    proxy, tmp_path, make_entry, h200
):
    a = TieredStore(Store(tmp_path / "a", create=True), RemoteTier(proxy.url, timeout_s=0.2))
    b = TieredStore(Store(tmp_path / "b", create=True), RemoteTier(proxy.url, timeout_s=0.2))
    a_fence, b_fence = a.fence("ag_gemm", KEY, h200), b.fence("ag_gemm", KEY, h200)
    landed = a.put(make_entry(block_m=64), fence=a_fence)
    with pytest.raises(Superseded) as refused:
        b.put(make_entry(block_m=32), fence=b_fence)
    assert refused.value.held == landed  # B takes A's entry
    assert a.remote.fetch("ag_gemm", KEY, h200) == landed
