"""The follower: the ops' tables refreshed or synced, swaps and calls counted, and a thread
that outlives a bad generation."""

from __future__ import annotations

import contextlib
import time

from warmup.serving import follower as follower_module
from warmup.serving.follower import Follower
from warmup.serving.metrics import ServingMetrics


class FakeStore:
    def __init__(self) -> None:
        self.version: tuple[object, ...] = (1,)
        self.refreshes = 0

    def refresh(self) -> None:
        self.refreshes += 1


class FakeOp:
    """An op that swaps when told to; ``broken``: its refresh raises."""

    def __init__(self, *, collective: bool = False, swaps: bool = True) -> None:
        self.kernel, self.layer, self.collective = "matmul", "layer", collective
        self.version: tuple[object, ...] = ()
        self.swaps, self.broken = swaps, False
        self.calls = [0, 0, 0]
        self.pending = None
        self.synced = self.refreshed = 0

    def refresh(self) -> bool:
        self.refreshed += 1
        if self.broken:
            raise RuntimeError("a bad generation")
        return self.swaps

    def sync(self) -> bool:
        self.synced += 1
        return self.swaps


class Guard:
    def __init__(self) -> None:
        self.exempted = 0

    @contextlib.contextmanager
    def exempt(self):
        self.exempted += 1
        yield


def follower(tmp_path, store=None, guard=None, refresh_s=60.0) -> Follower:
    metrics = ServingMetrics()
    return Follower(
        store or FakeStore(), metrics, metrics_dir=tmp_path, refresh_s=refresh_s, guard=guard
    )


def swaps(follower: Follower) -> float | None:
    labels = {"kernel": "matmul", "rank": "0"}
    return follower.metrics.registry.get_sample_value(
        "triton_warmup_serving_generation_swaps_total", labels
    )


def test_an_op_is_made_exempt_from_the_guard_and_followed(tmp_path):
    guard = Guard()
    ops = follower(tmp_path, guard=guard)
    op = ops.keep(FakeOp)
    assert ops.ops == [op] and guard.exempted == 1


def test_a_refresh_skips_ops_built_from_these_files_and_counts_swaps(tmp_path):
    store = FakeStore()
    ops = follower(tmp_path, store)
    current, stale = ops.keep(FakeOp), ops.keep(FakeOp)
    current.version = store.version
    assert ops.refresh() == 1 and store.refreshes == 1
    assert current.refreshed == 0 and stale.refreshed == 1 and swaps(ops) == 1


def test_a_one_device_op_failing_in_a_sync_leaves_the_collective_ones_in_it(tmp_path):
    ops = follower(tmp_path)
    local = ops.keep(FakeOp)
    local.broken = True
    tensor_parallel = ops.keep(lambda: FakeOp(collective=True))
    assert ops.sync() == 1 and tensor_parallel.synced == 1 and local.refreshed == 1


def test_calls_are_exported_once_and_pending_tables_counted(tmp_path):
    ops = follower(tmp_path)
    op = ops.keep(FakeOp)
    op.calls[:] = [3, 1, 0]
    op.pending = object()
    ops.flush_metrics()
    op.calls[0] += 2
    ops.flush_metrics()
    text = (tmp_path / "serving-rank0.prom").read_text()
    assert 'triton_warmup_serving_calls_total{kernel="matmul",rank="0",source="tuned"} 5.0' in text
    assert 'source="nearest"} 1.0' in text and 'source="fallback"' not in text
    assert 'triton_warmup_serving_pending_tables{kernel="matmul",rank="0"} 1.0' in text


def test_the_thread_outlives_a_bad_generation_and_writes_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(follower_module, "METRICS_EVERY_S", 0.0)
    ops = follower(tmp_path, refresh_s=0.01)
    op = ops.keep(FakeOp)
    op.broken = True
    ops.start()
    deadline = time.monotonic() + 10
    while op.refreshed < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    ops.stop()
    assert op.refreshed >= 2  # still following after a refresh raised
    assert (tmp_path / "serving-rank0.prom").exists()
