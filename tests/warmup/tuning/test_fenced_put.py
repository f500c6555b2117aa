"""The fenced put: this tuning lands, or the entry another holder stored first is used;
a holder that lost its lock stores only once it holds it again."""

import contextlib

from registry import Entry, KernelConfig, Store, cpu_fingerprint, lock
from registry.locks import backend_from_url
from registry.remote.tiered import TieredStore
from tests.warmup.tuning.fakes import FakeTask, configs
from warmup.core.collectives import Lockstep
from warmup.tuning.fenced_put import FencedPut
from warmup.tuning.fleet_lock import FleetLock, lock_name
from warmup.tuning.lookup import RegistryLookup
from warmup.tuning.outcome import TuneOptions, TuneOutcome, TunerStats
from warmup.tuning.search import SearchResult, summarize

TIMINGS = {16: 3.0, 32: 1.2, 64: 0.9}


def _put(tmp_path, **options):
    store = TieredStore(Store(tmp_path / "registry", create=True))
    parts = (Lockstep(), TuneOptions(**options), TunerStats())
    lookup = RegistryLookup(store, *parts)
    fleet = FleetLock(parts[0], backend_from_url(str(tmp_path / "locks")), *parts[1:])
    return FencedPut(store, *parts, lookup=lookup, fleet_lock=fleet)


def _tuned(block=64):
    search = SearchResult([summarize(configs(b)[0], [TIMINGS[b]]) for b in (64, 32, 16)])
    return TuneOutcome(configs(block)[0], "tuned", search=search)


def _fingerprint(task):
    return cpu_fingerprint().with_kernel(task.kernel_hash)


class LostHolder:
    """A holder whose lock went while it tuned (``confirm`` says how)."""

    def confirm(self):
        return "its key is gone"


def test_a_fenced_put_with_nobody_before_it_lands(tmp_path):
    task = FakeTask(dict(TIMINGS))
    put = _put(tmp_path)
    fence = put.store.fence(task.kernel, task.key(), _fingerprint(task))
    outcome = _tuned()
    put.store_outcome(task, _fingerprint(task), task.key(), outcome, 0.0, fence)
    [stored] = put.store.local.entries()
    assert stored == outcome.entry and stored.best.meta["BLOCK"] == 64
    assert [m.config.meta["BLOCK"] for m in stored.measurements] == [64, 32, 16]
    assert not outcome.superseded and put.stats.superseded == 0


def test_a_put_refused_by_its_fence_takes_the_entry_that_landed(tmp_path):
    task = FakeTask(dict(TIMINGS))
    put = _put(tmp_path)
    fence = put.store.fence(task.kernel, task.key(), _fingerprint(task))
    theirs = Entry.make(
        task.kernel, task.key(), _fingerprint(task), KernelConfig.make({"BLOCK": 32})
    )
    put.store.put(theirs)  # another holder, after this one fenced
    outcome = _tuned()
    put.store_outcome(task, _fingerprint(task), task.key(), outcome, 0.0, fence)
    assert outcome.superseded and outcome.config.meta["BLOCK"] == 32 and put.stats.superseded == 1
    assert outcome.notes == ["another holder stored this shape first: its entry is used"]
    assert [e.best.meta["BLOCK"] for e in put.store.local.entries()] == [32]


def test_a_holder_that_lost_its_lock_stores_once_it_holds_it_again(tmp_path):
    task = FakeTask(dict(TIMINGS))
    put = _put(tmp_path)
    fence = put.store.fence(task.kernel, task.key(), _fingerprint(task))
    outcome = _tuned()
    put.store_outcome(task, _fingerprint(task), task.key(), outcome, 0.0, fence, LostHolder())
    assert [e.best.meta["BLOCK"] for e in put.store.local.entries()] == [64]
    assert outcome.notes == []


def test_a_lost_lock_not_taken_again_leaves_the_tuning_unstored(tmp_path):
    task = FakeTask(dict(TIMINGS))
    put = _put(tmp_path, rank_timeout_s=0.2)  # waits min(lock timeout, 0.1 s) to relock
    fence = put.store.fence(task.kernel, task.key(), _fingerprint(task))
    outcome = _tuned()
    other = backend_from_url(str(tmp_path / "locks"))
    with contextlib.ExitStack() as held:
        held.enter_context(lock(lock_name(task.kernel, task.key()), ttl=30, backend=other))
        put.store_outcome(task, _fingerprint(task), task.key(), outcome, 0.0, fence, LostHolder())
    assert put.store.local.entries() == [] and outcome.entry.best.meta["BLOCK"] == 64
    assert outcome.notes == [
        f"not stored: lock {lock_name(task.kernel, task.key())} lost (its key is gone), "
        "not taken again"
    ]
