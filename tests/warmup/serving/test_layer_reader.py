"""A layer's tuned configs read whole from the registry, and agreed on with rank 0."""

from __future__ import annotations

import pytest

from kernels.adapter import Layer
from registry import Store, cpu_fingerprint
from registry.core.fingerprint import MatchPolicy
from tests.warmup.serving._fake_served import MAX_M, FakeServed, N, config, entry
from warmup.serving.layer_reader import LayerReader

LAYER = Layer(N, 40, "fp32", MAX_M)


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "registry", create=True)
    store.put_many([entry(16, 16), entry(64, 32), entry(32, 64, n=N + 8)])  # one other layer
    return store


def reader(store, served=None) -> LayerReader:
    from kernels import matmul

    return LayerReader(
        served or FakeServed(),
        LAYER,
        store=store,
        fingerprint=cpu_fingerprint(matmul.kernel_hash()),
        match_policy=MatchPolicy.EXACT,
    )


def test_a_read_takes_this_layers_best_configs_by_m_and_the_version_it_saw(store):
    layer = reader(store)
    assert layer.read() == {16: config(16), 64: config(32)}
    assert layer.version == store.version != ()


def test_a_registry_that_moves_during_a_read_is_read_again(store):
    layer = reader(store)
    like, calls = store.like, []

    def moving(*args, **kwargs):
        found = like(*args, **kwargs)
        calls.append(found)
        if len(calls) == 1:  # a new generation lands while the first read runs
            store.put(entry(32, 64))
        return found

    store.like = moving
    assert layer.read() == {16: config(16), 32: config(64), 64: config(32)}
    assert len(calls) == 2 and layer.version == store.version


def test_every_rank_takes_rank_0s_configs_and_reads_again_when_they_differ(store):
    served = FakeServed(collective=True)
    layer = reader(store, served)
    mine, agreed = layer.read_agreed()
    assert mine == agreed == {16: config(16), 64: config(32)} and layer.version != ()
    served.rank0 = {"16": config(64, "split_k").to_json()}
    mine, agreed = layer.read_agreed()
    assert mine == {16: config(16), 64: config(32)} and agreed == {16: config(64, "split_k")}
    assert layer.version == ()  # another generation: the follower reads again


def test_a_rank_that_cannot_read_still_agrees_in_a_collective_layer_only(store):
    def unreadable(*args, **kwargs):
        raise OSError("EIO")

    served = FakeServed(collective=True)
    served.rank0 = {"16": config(16).to_json()}
    layer = reader(store, served)
    store.like = unreadable
    assert layer.read_agreed() == ({}, {16: config(16)}) and served.agreed == 1
    with pytest.raises(OSError, match="EIO"):
        reader(store).read_agreed()  # one device: nobody waits, the error is the caller's


def test_a_layer_with_no_entry_says_what_the_registry_holds_and_what_to_do(tmp_path):
    store = Store(tmp_path / "registry", create=True)
    store.put(entry(32, 64, n=N + 8))
    message = reader(store).no_entries()
    assert "No tuned matmul config for layer" in message and "match policy exact" in message
    assert "holds 1 matmul entries" in message and "on_missing='fallback'" in message
