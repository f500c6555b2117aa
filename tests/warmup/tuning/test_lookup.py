"""The tuner's lookups: hit or miss on rank 0's view, the fence under the lock, fallback."""

import pytest

from registry import Entry, KernelConfig, Store, cpu_fingerprint
from registry.core.errors import Superseded
from registry.remote.tiered import TieredStore
from tests.warmup.tuning.fakes import FakeTask
from warmup.core.collectives import Lockstep
from warmup.tuning.lookup import RegistryLookup
from warmup.tuning.outcome import TuneOptions, TunerStats

TIMINGS = {16: 3.0, 32: 1.2, 64: 0.9}


class Picky(FakeTask):
    """A task whose space changed: it runs only its candidates (a decorated function's)."""

    def accepts(self, config):
        return config in self.candidates()


def _lookup(tmp_path, **options):
    store = TieredStore(Store(tmp_path / "registry", create=True))
    return RegistryLookup(store, Lockstep(), TuneOptions(**options), TunerStats())


def _stored(lookup, task, block, m=None):
    key = task.key() if m is None else {**task.key(), "M": m}
    fingerprint = cpu_fingerprint().with_kernel(task.kernel_hash)
    entry = Entry.make(task.kernel, key, fingerprint, KernelConfig.make({"BLOCK": block}))
    return lookup.store.put(entry)


def _fingerprint(task):
    return cpu_fingerprint().with_kernel(task.kernel_hash)


def test_a_miss_then_a_hit_from_the_local_tier(tmp_path):
    task = FakeTask(dict(TIMINGS))
    lookup = _lookup(tmp_path)
    assert lookup.agreed(task, task.key(), _fingerprint(task)) is None
    entry = _stored(lookup, task, 32)
    assert lookup.agreed(task, task.key(), _fingerprint(task)) == (entry, "registry")


def test_a_stored_config_no_longer_a_candidate_is_a_miss(tmp_path):
    task = Picky(dict(TIMINGS))
    lookup = _lookup(tmp_path)
    _stored(lookup, task, 512)  # a space that had 512 once
    assert lookup.look(task, task.key(), _fingerprint(task), remote_now=False) is None
    assert lookup.agreed(task, task.key(), _fingerprint(task)) is None


def test_the_lookup_under_the_lock_fences_the_entry(tmp_path):
    task = FakeTask(dict(TIMINGS))
    lookup = _lookup(tmp_path)
    found, fence = lookup.fenced(task, task.key(), _fingerprint(task))
    assert found is None
    theirs = _stored(lookup, task, 16)  # another holder lands after the fence
    mine = Entry.make(task.kernel, task.key(), _fingerprint(task), KernelConfig.make({"BLOCK": 64}))
    with pytest.raises(Superseded):
        lookup.store.put(mine, fence=fence)
    assert lookup.fenced(task, task.key(), _fingerprint(task))[0] == (theirs, "registry")


def test_a_fallback_takes_the_nearest_shape_else_the_spaces_first(tmp_path):
    task = FakeTask(dict(TIMINGS), m=1024)
    lookup = _lookup(tmp_path, policy="fallback")
    default = lookup.fallback(task, _fingerprint(task), 0.0)
    assert default.source == "fallback" and default.config.meta["BLOCK"] == 16
    assert default.notes == ["fallback from the space's default"]
    _stored(lookup, task, 64, m=512)
    near = lookup.fallback(task, _fingerprint(task), 0.0)
    assert near.config.meta["BLOCK"] == 64 and "512" in near.notes[0]
    assert (lookup.stats.misses, lookup.stats.fallbacks, task.launches) == (2, 2, 0)
