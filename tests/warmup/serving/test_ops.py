"""Serving ops on CPU: the M table, the pick rule, fallbacks, following the registry."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from kernels import matmul
from kernels.adapter import Layer
from registry import Entry, KernelConfig, Store, cpu_fingerprint
from registry.storage.entry_reader import EntryReader
from tests.conftest import run_rank_processes, settings_for, write_manifest
from warmup.core.manifest import load_manifest
from warmup.run.launch import run
from warmup.serving.layer_reader import LayerReader
from warmup.serving.ops import Serving, ServingError, ServingOp
from warmup.serving.table import NEAREST, TUNED, nearest_table

N, K = 24, 40


def config(block_m: int, algorithm: str | None = None) -> KernelConfig:
    return KernelConfig.make(
        {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2},
        algorithm=algorithm,
        num_warps=4,
    )


def entry(m: int, block_m: int, algorithm: str | None = None) -> Entry:
    key = matmul.ADAPTER.key(m=m, n=N, k=K, dtype="fp32", world=1)
    fingerprint = cpu_fingerprint(matmul.kernel_hash())
    return Entry.make("matmul", key, fingerprint, config(block_m, algorithm), source="tuned")


@pytest.fixture
def settings(tmp_path):
    return settings_for(tmp_path)


@pytest.fixture
def store(settings):
    store = Store(settings.paths.registry_dir, create=True)
    store.put_many([entry(16, 16), entry(64, 32)])
    # another layer and another kernel's entries must not leak into this op's table
    other = Entry.make(
        "matmul",
        matmul.ADAPTER.key(m=32, n=N + 8, k=K, dtype="fp32", world=1),
        cpu_fingerprint(matmul.kernel_hash()),
        config(64),
    )
    store.put(other)
    return store


def inputs(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(m)
    a = torch.randn(m, K, generator=generator)
    return a, torch.randn(K, N, generator=generator)


def test_an_op_serves_every_m_with_the_tables_config_and_counts_how(settings, store):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        assert op.table.buckets == (16, 64)
        for m in (16, 20, 50, 100, 1):
            a, b = inputs(m)
            torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)
        assert op.config_for(20) == config(16) and op.config_for(50) == config(32)
        assert op.calls == [1, 4, 0]  # tuned, nearest, fallback
        serving.flush_metrics()
    text = (settings.paths.metrics_dir / "serving-rank0.prom").read_text()
    calls = {
        s.labels["source"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "triton_warmup_serving_calls_total"
    }
    assert calls == {"tuned": 1.0, "nearest": 4.0}


def test_the_request_path_reads_no_registry(settings, store, monkeypatch):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=64, device="cpu")

        def no_disk(*args, **kwargs):
            raise AssertionError("the registry was read on the request path")

        for name in ("refresh", "entries", "lookup"):
            monkeypatch.setattr(Store, name, no_disk)
        for name in ("version", "load", "read"):  # the store's reads of its files
            monkeypatch.setattr(EntryReader, name, no_disk)
        a, b = inputs(33)
        torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)
        monkeypatch.undo()


def test_bad_calls_and_bad_layers_are_named(settings, store):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=64, device="cpu")
        with pytest.raises(ValueError, match=r"M=65 rows; this op serves 1\.\.64"):
            op(*inputs(65))
        a, b = inputs(8)
        with pytest.raises(ValueError, match="float64"):
            op(a.double(), b.double())
        with pytest.raises(ValueError, match=r"b \[40, 24\]"):
            op(a, b[:, :8])
        with pytest.raises(ServingError, match="No kernel adapter 'gemm'; known: ag_gemm, matmul"):
            serving.op("gemm", n=N, k=K, dtype="fp32", max_m=64)
        with pytest.raises(ValueError, match="max_m=0"):
            serving.op("matmul", n=N, k=K, dtype="fp32", max_m=0, device="cpu")


def test_a_layer_with_no_entry_is_an_error_or_a_counted_fallback(settings, store):
    with Serving(settings, follow=False) as serving:
        with pytest.raises(ServingError) as error:
            serving.op("matmul", n=N, k=K + 8, dtype="fp32", max_m=64, device="cpu")
        message = str(error.value)
        assert "No tuned matmul config for layer" in message and "'K': 48" in message
        assert "3 matmul entries for other layers" in message and "on_missing" in message
        op = serving.op(
            "matmul", n=N, k=K, dtype="fp16", max_m=64, device="cpu", on_missing="fallback"
        )
        a, b = inputs(8)
        assert op.table.buckets == () and op.config_for(8) == matmul.space()[0]
        a16, b16 = a.half(), b.half()
        torch.testing.assert_close(op(a16, b16).float(), a @ b, rtol=2e-2, atol=2e-2)
        assert op.calls == [0, 0, 1]


def _within(seconds: float, done: Callable[[], bool]) -> bool:
    """Whether ``done()`` holds within ``seconds``, checked every 20 ms."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_new_generation_reaches_a_running_op(settings, store):
    with Serving(settings.updated(serving_refresh_s=0.05)) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        assert op.config_for(30) == config(16)
        store.install([entry(32, 64)], record={"bundle": "b1"})  # a hot-reloaded bundle
        assert _within(10, lambda: op.table.buckets == (16, 32, 64))  # the follower's swap
        assert op.config_for(30) == config(64)
        a, b = inputs(30)
        torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)
        assert op.calls[TUNED] == 0 and op.calls[NEAREST] == 1
        store.rollback()
        assert _within(10, lambda: op.table.buckets == (16, 64))  # a rollback reaches it too
        assert serving.refresh() == 0  # the follower left nothing to swap


def test_a_manual_refresh_swaps_each_new_generation_once(settings, store):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        store.install([entry(32, 64)], record={"bundle": "b1"})
        assert op.table.buckets == (16, 64)  # no follower: nothing swaps by itself
        assert serving.refresh() == 1 and op.table.buckets == (16, 32, 64)
        store.rollback()
        assert serving.refresh() == 1 and op.table.buckets == (16, 64)
        assert serving.refresh() == 0  # nothing changed: no swap


@pytest.mark.slow
def test_a_server_serves_every_m_after_a_warmup_on_two_ranks(tmp_path):
    manifest = write_manifest(
        tmp_path / "m.yaml",
        "version: 1\nentries:\n  - {kernel: ag_gemm, dtype: fp32, world_size: 2,\n"
        "     shapes: [{M: [16, 48], N: 32, K: 32}]}\n",
    )
    settings = settings_for(tmp_path, manifest=manifest)
    assert run(settings, load_manifest(manifest)).ready
    args = [str(tmp_path / "init"), str(settings.paths.volume), str(settings.paths.work_dir)]
    results = run_rank_processes("tests.warmup.serving._serving_ranks", 2, *args, timeout=300)
    for result in results:
        assert result["buckets"] == [16, 48] and result["guard"] == 0
        for call in result["calls"]:
            assert call["error"] < 1e-5, call
        served = [call["m"] for call in result["calls"]]
        assert served == list(range(2, 65, 10))
        assert sum(result["counts"]) == len(served) and result["counts"][2] == 0
    assert results[0]["calls"] == results[1]["calls"]


def test_a_server_without_autotune_result_caching_is_warned(settings, store, caplog):
    from triton import knobs

    before = knobs.autotuning.cache
    try:
        for cached, warned in ((False, True), (True, False)):
            knobs.autotuning.cache = cached
            caplog.clear()
            with caplog.at_level("WARNING", "warmup.serving"), Serving(settings, follow=False):
                pass
            assert ("TRITON_CACHE_AUTOTUNING" in caplog.text) is warned
    finally:
        knobs.autotuning.cache = before


@pytest.mark.slow
def test_any_adapter_warms_and_serves_here_the_matmul(tmp_path):
    import warmup

    manifest = write_manifest(
        tmp_path / "m.yaml",
        "version: 1\nentries:\n  - {kernel: matmul, dtype: fp32, world_size: 1,\n"
        "     shapes: [{M: [8, 40], N: 16, K: 16}]}\n",
    )
    settings = settings_for(tmp_path, manifest=manifest, create_volume=True)
    status = warmup.warm(manifest, settings)
    assert status.state == "ready" and status.sources == {"tuned": 2}
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=16, k=16, dtype="fp32", max_m=64, device="cpu")
        assert op.table.buckets == (8, 40)
        for m in (1, 8, 20, 64):
            a, b = torch.randn(m, 16), torch.randn(16, 16)
            torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)
        assert op.calls == [1, 3, 0]


def test_a_generation_read_by_another_op_first_still_reaches_every_op(settings, store):
    with Serving(settings, follow=False) as serving:
        first = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        store.install([entry(32, 64)], record={"bundle": "b1"})
        # making the second op reads (and loads) the new generation before any refresh
        second = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=50, device="cpu")
        assert second.table.buckets == (16, 32, 64)
        assert serving.refresh() == 1  # the first op, built from the older generation
        assert first.table.buckets == (16, 32, 64) and first.config_for(30) == config(64)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dtype": "bf17"}, "dtype='bf17': must be one of bf16, fp16, fp32"),
        ({"n": "8"}, "n='8': must be an int >= 1"),
        ({"max_m": 16.0}, "max_m=16.0: must be an int >= 1"),
        ({"k": True}, "k=True: must be an int >= 1"),
    ],
)
def test_a_bad_layer_is_named_before_anything_is_made(settings, store, changes, message):
    with Serving(settings, follow=False) as serving, pytest.raises(ValueError) as error:
        serving.op("matmul", **{"n": N, "k": K, "dtype": "fp32", "max_m": 64, **changes})
    assert message in str(error.value)


def test_config_for_takes_only_ms_a_call_can_have():
    table = nearest_table({4: config(16)}, step=2, max_m=8)
    op = object.__new__(ServingOp)  # the lookup alone: no registry, no kernel
    op.table, op.step, op.kernel = table, 2, "ag_gemm"
    op.layer = Layer(8, 8, "bf16", 8)
    assert op.config_for(6) == config(16)
    for bad in (0, 3, 10):
        with pytest.raises(ValueError, match=r"is not a multiple of 2 in 1\.\.8"):
            op.config_for(bad)


class CollectiveMatmul(matmul.MatmulServed):
    """The matmul as if each call were a collective of a tensor-parallel group (the
    matmul ignores a config's algorithm); ``rank0`` stands for rank 0's registry."""

    collective = True

    def __init__(self, layer: Layer, *, device: object) -> None:
        super().__init__(layer, device=device)
        self.agreed = 0
        self.rank0: dict[int, object] | None = None
        self.prepared: list[tuple[KernelConfig, list[int]]] = []
        self.votes: list[bool] = []  # this rank's word at each sync
        self.peers_built = True  # what the other ranks say

    def agree(self, value: object) -> object:
        self.agreed += 1
        return value if self.rank0 is None else self.rank0

    def all_true(self, flag: bool) -> bool:
        self.votes.append(flag)
        return flag and self.peers_built

    def prepare(self, config: KernelConfig, rows: Sequence[int]) -> None:
        self.prepared.append((config, list(rows)))
        super().prepare(config, rows)


@pytest.fixture
def collective(monkeypatch):
    """``serving.op("matmul", ...)`` makes collective ops; the list holds their layers."""
    made: list[CollectiveMatmul] = []

    def serve(layer, *, group, device):
        made.append(CollectiveMatmul(layer, device=device))
        return made[-1]

    monkeypatch.setattr(matmul.ADAPTER, "serve", serve)
    return made


def pending_tables(serving: Serving) -> float | None:
    labels = {"kernel": "matmul", "rank": "0"}
    return serving.metrics.registry.get_sample_value("triton_warmup_serving_pending_tables", labels)


def swaps(serving: Serving) -> float | None:
    labels = {"kernel": "matmul", "rank": "0"}
    return serving.metrics.registry.get_sample_value(
        "triton_warmup_serving_generation_swaps_total", labels
    )


def test_every_config_is_prepared_for_the_ms_it_serves(settings, store, collective):
    """A library call chooses its kernel at the first call of each shape: the layer is
    told every M each config will serve, at construction and for a new table."""
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        served = collective[0]
        by_config = {c: ms for c, ms in served.prepared}
        assert sorted(m for ms in by_config.values() for m in ms) == list(range(1, 101))
        for chosen, ms in by_config.items():
            assert all(op.config_for(m) == chosen for m in ms)
        served.prepared.clear()
        store.install([entry(32, 64, "split_k")], record={"bundle": "b1"})
        assert serving.sync() == 1
        routed = {c: ms for c, ms in served.prepared}
        assert routed[config(64, "split_k")] == list(range(23, 46))  # M=32's share


def test_a_change_of_algorithm_in_a_collective_op_waits_for_sync(
    settings, store, collective, caplog
):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        served, table = collective[0], op.table
        assert served.agreed == 1 and op.config_for(30) == config(16)
        # M=23..45 now take M=32's config, which runs another algorithm
        store.install([entry(32, 64, "split_k")], record={"bundle": "b1"})
        with caplog.at_level("WARNING", "warmup.serving"):
            assert serving.refresh() == 0
            assert op.table is table and op.config_for(30) == config(16)
            assert op.pending is not None and op.pending.buckets == (16, 32, 64)
            other = matmul.ADAPTER.key(m=8, n=N + 8, k=K, dtype="fp32", world=1)
            fingerprint = cpu_fingerprint(matmul.kernel_hash())
            store.put(Entry.make("matmul", other, fingerprint, config(16)))  # another layer's
            assert serving.refresh() == 0 and op.table is table  # the same pending table
        warnings = [r.getMessage() for r in caplog.records if "serving.sync()" in r.getMessage()]
        assert len(warnings) == 1, warnings  # once per pending table
        assert "at 23 Ms (M 23..45)" in warnings[0] and "on every rank" in warnings[0]
        a, b = inputs(30)
        torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)
        assert served.agreed == 1  # a refresh is no collective
        serving.flush_metrics()
        assert pending_tables(serving) == 1.0  # a missing sync() shows on the sidecar
        pending = op.pending
        assert serving.sync() == 1 and served.agreed == 2
        assert op.table is pending and op.pending is None
        serving.flush_metrics()
        assert pending_tables(serving) == 0.0
        assert op.config_for(30) == config(64, "split_k") and swaps(serving) == 1.0
        torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)
        assert serving.sync() == 0 and served.agreed == 3  # one agree per sync, always


def test_sync_takes_rank_0s_table_and_a_rollback_drops_a_pending_one(settings, store, collective):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        served, table = collective[0], op.table
        store.install([entry(32, 64, "split_k")], record={"bundle": "b1"})
        assert serving.refresh() == 0 and op.pending is not None
        served.rank0 = {m: c.to_json() for m, c in op.tuned.items()}  # rank 0: not seen yet
        assert serving.sync() == 0 and op.table is table  # every rank keeps rank 0's
        assert op.pending is not None  # still this rank's registry: synced once rank 0 sees it
        served.rank0 = None
        assert serving.sync() == 1 and op.config_for(30) == config(64, "split_k")
        store.rollback()  # back to the first table: an algorithm change again
        assert serving.refresh() == 0 and op.pending is not None
        store.install([entry(32, 64, "split_k")], record={"bundle": "b1 again"})
        assert serving.refresh() == 0 and op.pending is None  # the registry is back
        assert op.config_for(30) == config(64, "split_k")


def test_a_rank_that_cannot_read_the_registry_still_agrees_at_sync(
    settings, store, collective, monkeypatch
):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        served = collective[0]
        served.rank0 = {16: config(16).to_json(), 32: config(64, "split_k").to_json()}

        def unreadable(self):
            raise OSError("EIO")

        monkeypatch.setattr(LayerReader, "read", unreadable)
        assert serving.sync() == 1 and served.agreed == 2  # no rank is left waiting
        assert op.table.buckets == (16, 32) and op.config_for(30) == config(64, "split_k")


@pytest.mark.parametrize("where", ["here", "on a peer"])
def test_a_table_one_rank_cannot_build_is_taken_by_none(
    settings, store, collective, monkeypatch, where
):
    """Out of memory on one rank while building: if that rank kept its table and the
    others swapped, they would run different algorithms' collectives."""
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        served, table = collective[0], op.table
        store.install([entry(32, 64, "split_k")], record={"bundle": "b1"})
        if where == "here":
            real = served.prepare

            def out_of_memory(config, rows):
                if config.algorithm == "split_k":
                    raise RuntimeError("CUDA out of memory")
                real(config, rows)

            monkeypatch.setattr(served, "prepare", out_of_memory)
        else:
            served.peers_built = False
        assert serving.sync() == 0 and op.table is table
        assert served.votes == [where != "here"]
        assert serving.sync() == 0 and op.table is table  # the same table is not retried
        assert served.agreed == 3 and len(served.votes) == 2  # but every sync still votes


def test_a_one_device_op_failing_in_a_sync_leaves_the_collective_ones_in_it(
    settings, store, collective, monkeypatch
):
    with Serving(settings, follow=False) as serving:
        with monkeypatch.context() as one_device:
            one_device.setattr(CollectiveMatmul, "collective", False)
            local = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        store.install([entry(32, 64)], record={"bundle": "b1"})

        def broken():
            raise OSError("EIO")

        monkeypatch.setattr(local, "refresh", broken)
        serving.sync()
        assert collective[1].agreed == 2 and collective[1].votes == [True]


def test_a_change_of_block_shapes_only_swaps_on_refresh_in_a_collective_op(
    settings, store, collective
):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        store.install([entry(32, 64)], record={"bundle": "b1"})  # no algorithm, as the others
        assert serving.refresh() == 1 and op.pending is None
        assert op.config_for(30) == config(64) and collective[0].agreed == 1
        a, b = inputs(30)
        torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)


def test_a_change_of_algorithm_in_an_op_of_one_device_swaps_on_refresh(settings, store):
    with Serving(settings, follow=False) as serving:
        op = serving.op("matmul", n=N, k=K, dtype="fp32", max_m=100, device="cpu")
        assert op.collective is False
        store.install([entry(32, 64, "split_k")], record={"bundle": "b1"})
        assert serving.refresh() == 1 and op.pending is None
        assert op.config_for(30) == config(64, "split_k")
        store.install([entry(80, 16, "split_k")], record={"bundle": "b2"})
        assert serving.sync() == 1 and op.config_for(80) == config(16, "split_k")
        a, b = inputs(30)
        torch.testing.assert_close(op(a, b), a @ b, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_two_ranks_take_a_change_of_algorithm_together_at_sync(tmp_path):
    from tests.warmup.serving._serving_ranks import BASELINE, FUSED, SYNC_MS
    from tests.warmup.serving._serving_ranks import entry as ag_entry

    settings = settings_for(tmp_path)
    Store(settings.paths.registry_dir, create=True).put_many(
        [ag_entry(16, BASELINE), ag_entry(48, FUSED)]
    )
    args = [
        str(tmp_path / "init"),
        str(settings.paths.volume),
        str(settings.paths.work_dir),
        "sync",
    ]
    ranks = run_rank_processes("tests.warmup.serving._serving_ranks", 2, *args, timeout=300)
    assert ranks[1]["refreshed"] == 0 and ranks[1]["pending"] is True  # its follower waits
    for result in ranks:
        assert result["synced"] == 1 and result["buckets"] == [16, 32, 48]
        for phase in ("before", "between", "after"):
            assert [call["m"] for call in result[phase]] == list(SYNC_MS)
            for call in result[phase]:
                assert call["error"] < 1e-5, (phase, call)
        assert result["between"][1]["config"] == FUSED.label()  # M=32: M=48's
        assert result["after"][1]["config"] == BASELINE.label()  # M=32: its own
        assert result["guard"] == 0
    for phase in ("before", "between", "after"):  # both ranks on the same table
        assert ranks[0][phase] == ranks[1][phase]


@pytest.mark.slow
def test_two_layers_of_a_process_share_one_workspace_and_both_compute(tmp_path):
    from tests.warmup.serving._serving_ranks import FUSED
    from tests.warmup.serving._serving_ranks import entry as ag_entry

    settings = settings_for(tmp_path)
    Store(settings.paths.registry_dir, create=True).put_many([ag_entry(16, FUSED)])
    args = [str(tmp_path / "init"), str(settings.paths.volume), str(settings.paths.work_dir)]
    ranks = run_rank_processes(
        "tests.warmup.serving._serving_ranks", 2, *args, "layers", timeout=300
    )
    for result in ranks:
        assert result["first_op"]["workspace.made"] == 1, result  # one mapping, one rendezvous
        assert "workspace.made" not in result["second_op"], result  # none for the second
        assert result["second_op"]["workspace.reused"] >= 1 and result["one_space"], result
        assert max(result["errors"]) < 1e-5, result
