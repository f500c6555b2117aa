"""A layer's tables, each config built once for the Ms it serves."""

from __future__ import annotations

from kernels.adapter import Layer
from tests.warmup.serving._fake_served import MAX_M, FakeServed, N, config
from warmup.serving.table import FALLBACK, NEAREST, TUNED
from warmup.serving.table_builder import TableBuilder

LAYER = Layer(N, 40, "fp32", MAX_M)


def test_a_layer_with_no_tuned_config_falls_back_to_the_default_at_every_m():
    served = FakeServed()
    table = TableBuilder(served, LAYER).table({})
    assert table.buckets == () and table.configs == (config(128),)
    assert len(table.pick) == MAX_M + 1 and set(table.source) == {FALLBACK}
    assert served.prepared == []  # made, not built


def test_every_config_is_built_for_the_ms_it_serves():
    served = FakeServed()
    table = TableBuilder(served, LAYER).built({16: config(16), 64: config(32)})
    assert table.buckets == (16, 64) and table.source[16] == TUNED and table.source[20] == NEAREST
    built = dict(served.prepared)
    small = [m for m in range(1, MAX_M + 1) if table.config_for(m) == config(16)]
    assert built[config(16)] == small
    assert sorted(built[config(16)] + built[config(32)]) == list(range(1, MAX_M + 1))


def test_a_new_table_builds_only_the_configs_and_ms_not_built_yet():
    served = FakeServed()
    builder = TableBuilder(served, LAYER)
    builder.built({16: config(16), 64: config(32)})
    served.prepared.clear()
    builder.built({16: config(16), 64: config(32)})
    assert served.prepared == []  # the same table: nothing to build
    table = builder.built({16: config(16), 64: config(32), 100: config(64)})
    assert [c for c, _ in served.prepared] == [config(64)]  # the Ms it serves, a new config
    assert served.prepared[0][1] == list(range(80, MAX_M + 1))  # a tie goes to the larger M
    assert all(table.config_for(m) == config(64) for m in served.prepared[0][1])
