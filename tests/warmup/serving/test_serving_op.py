"""A serving op on a recording served layer: its pick, and its table's refresh and sync."""

from __future__ import annotations

import pytest

from kernels import matmul
from kernels.adapter import Layer
from registry import Store, cpu_fingerprint
from tests.conftest import settings_for
from tests.warmup.serving._fake_served import MAX_M, FakeServed, N, config, entry
from warmup.serving.layer_reader import LayerReader
from warmup.serving.serving_op import ServingError, ServingOp

LAYER = Layer(N, 40, "fp32", MAX_M)


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "registry", create=True)
    store.put_many([entry(16, 16), entry(64, 32)])
    return store


def make(tmp_path, store, served, on_missing="error") -> ServingOp:
    reader = LayerReader(
        served,
        LAYER,
        store=store,
        fingerprint=cpu_fingerprint(matmul.kernel_hash()),
        match_policy=settings_for(tmp_path).run.match_policy,
    )
    return ServingOp(reader, on_missing=on_missing)


def test_a_call_runs_its_ms_config_and_counts_how_it_was_chosen(tmp_path, store):
    served = FakeServed()
    op = make(tmp_path, store, served)
    assert [op(m, None) for m in (16, 20, 50)] == [config(16), config(16), config(32)]
    assert op.calls == [1, 2, 0] and len(served.rehearsed) == 1
    with pytest.raises(ValueError, match=r"this op serves 1\.\.100"):
        op(MAX_M + 1, None)


def test_a_layer_with_no_entry_is_an_error_unless_it_falls_back(tmp_path):
    empty = Store(tmp_path / "empty", create=True)
    with pytest.raises(ServingError, match="No tuned matmul config"):
        make(tmp_path, empty, FakeServed())
    op = make(tmp_path, empty, FakeServed(), on_missing="fallback")
    assert op(7, None) == config(128) and op.calls == [0, 0, 1]


def test_a_collective_op_swaps_new_block_shapes_but_keeps_a_new_algorithm_for_sync(tmp_path, store):
    served = FakeServed(collective=True)
    op = make(tmp_path, store, served)
    store.put(entry(32, 64))  # block shapes only
    assert op.refresh() and op.config_for(32) == config(64)
    before = op.config_for(48)
    store.put(entry(48, 64, "split_k"))
    assert not op.refresh() and op.pending is not None  # built, waiting
    assert op.config_for(48) == before and served.agreed == 1  # a refresh is no collective
    assert op.sync() and op.pending is None and op.config_for(48) == config(64, "split_k")


def test_a_table_a_peer_cannot_build_is_taken_by_no_rank_nor_built_again(tmp_path, store):
    served = FakeServed(collective=True)
    op = make(tmp_path, store, served)
    store.put(entry(48, 64, "split_k"))
    served.peers_built = False
    assert not op.sync() and op.config_for(48) == config(32)
    served.prepared.clear()
    assert not op.sync() and served.prepared == []  # rejected: not built at every sync
