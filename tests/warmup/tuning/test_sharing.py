"""Work sharing: a pod moves on from a shape another pod is tuning, and a fleet tunes
every shape once. In-process tests hold a lock from a thread; the fleet tests start
pods of gloo ranks (``_fleet_pods``) on one volume, or on their own volumes sharing
only a real redis-server."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from registry import Entry, KernelConfig, Store, cpu_fingerprint, lock
from registry.locks import backend_from_url
from tests.conftest import DEMO, env_without_interpreter, free_port, last_json, run_processes
from tests.registry.test_redis_outage import proxy, redis  # noqa: F401  (fixtures)
from tests.warmup.tuning._fleet_pods import SHAPES
from tests.warmup.tuning.fakes import FakeTask, fake_timer
from warmup.core.manifest import load_manifest
from warmup.core.results import RunStatus
from warmup.tuning import sharing
from warmup.tuning.sharing import Job, rotated, take_order, warm_shared
from warmup.tuning.tuner import TuneOptions, Tuner


def test_rotated_starts_at_the_fraction_and_keeps_every_item():
    items = list(range(8))
    assert rotated(items, 0.0) == items
    assert rotated(items, 0.5) == [4, 5, 6, 7, 0, 1, 2, 3]
    assert rotated(items, 0.999) == [7, 0, 1, 2, 3, 4, 5, 6]
    assert rotated([], 0.3) == []
    for fraction in (0.1, 0.37, 0.8):
        assert sorted(rotated(items, fraction)) == items


def test_the_costliest_shapes_come_first_and_equal_costs_keep_the_rotation():
    items = [("a", 1), ("b", 5), ("c", 1), ("d", 3), ("e", 1), ("f", 5)]
    ordered = take_order(items, 0.5, cost=lambda item: item[1])
    # rotated by half: d e f a b c; then by cost, ties in that order
    assert ordered == [("f", 5), ("b", 5), ("d", 3), ("e", 1), ("a", 1), ("c", 1)]
    same = [(name, 0) for name in "abcd"]
    assert take_order(same, 0.5, cost=lambda item: item[1]) == rotated(same, 0.5)
    assert take_order([], 0.3, cost=lambda item: 0) == []


def _job(tmp_path: Path, m: int, *, lock_timeout_s: float = 30.0) -> Job:
    task = FakeTask({16: 1.0, 32: 0.5}, m=m)
    tuner = Tuner(
        Store(tmp_path / "registry", create=True),
        cpu_fingerprint(),
        timer=fake_timer(task),
        lock_backend=backend_from_url(str(tmp_path / "locks")),
        options=TuneOptions(lock_timeout_s=lock_timeout_s, lock_ttl_s=5),
    )
    return Job(task, tuner)


def _lock_name(job: Job) -> str:
    return f"tune/{job.task.kernel}/{json.dumps(job.task.key(), sort_keys=True)}"


class OtherPod(threading.Thread):
    """Holds one shape's lock until ``release`` is set; stores an entry first if told."""

    def __init__(self, job: Job, folder: Path, *, stores: bool) -> None:
        super().__init__(daemon=True)
        self.job, self.folder, self.stores = job, folder, stores
        self.holding, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        backend = backend_from_url(str(self.folder / "locks"))  # a backend of its own
        with lock(_lock_name(self.job), ttl=5, timeout=5, backend=backend):
            self.holding.set()
            self.release.wait(30)
            if self.stores:
                fingerprint = cpu_fingerprint().with_kernel(self.job.task.kernel_hash)
                config = KernelConfig.make({"BLOCK": 16})
                entry = Entry.make(self.job.task.kernel, self.job.task.key(), fingerprint, config)
                Store(self.folder / "registry", create=True).put(entry)


@pytest.mark.parametrize("holder_stores", [True, False])
def test_a_held_shape_is_warmed_after_the_others(tmp_path, holder_stores):
    jobs = [_job(tmp_path, m) for m in (64, 128, 256)]
    other = OtherPod(jobs[0], tmp_path, stores=holder_stores)
    other.start()
    assert other.holding.wait(10)
    order = []
    for settled in warm_shared(jobs, lock_timeout_s=30):
        assert settled.outcome is not None, settled.error
        order.append((settled.job.task.key()["M"], settled.outcome.source))
        if len(order) == 2:  # the free shapes are done: the other pod finishes
            other.release.set()
    other.join(10)
    assert order[:2] == [(128, "tuned"), (256, "tuned")]
    # Stored by the pod that held it: found. Released without storing (its pod died
    # after the lock ended): tuned here.
    assert order[2] == (64, "registry" if holder_stores else "tuned")
    # the held shape's task held no inputs while it waited, and made them once, when it
    # was found or its lock taken; the others were never asked
    held = jobs[0].task
    assert (held.drops, held.remakes, held.holding) == (1, 1, True)
    assert [(j.task.drops, j.task.remakes) for j in jobs[1:]] == [(0, 0), (0, 0)]


def test_a_shape_held_past_the_lock_timeout_fails_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(sharing, "POLL_CAP_S", 0.05)
    jobs = [_job(tmp_path, m, lock_timeout_s=0.5) for m in (64, 128)]
    other = OtherPod(jobs[0], tmp_path, stores=False)
    other.start()
    assert other.holding.wait(10)
    try:
        started = time.monotonic()
        settled = list(warm_shared(jobs, lock_timeout_s=0.5))
    finally:
        other.release.set()
        other.join(10)
    assert [s.job.task.key()["M"] for s in settled] == [128, 64]
    assert settled[0].outcome is not None and settled[0].outcome.source == "tuned"
    assert settled[1].outcome is None and "in 0.5 s of waiting" in str(settled[1].error)
    assert 0.5 <= settled[1].deferred_s < 5 and time.monotonic() - started < 10
    assert 0.2 <= settled[1].idle_s <= settled[1].deferred_s  # waiting, not tuning 128
    # many tries in that time, and none of them made the waiting shape's inputs again
    assert (jobs[0].task.drops, jobs[0].task.remakes) == (1, 0)


# ---- a lock server that stops answering -------------------------------------------------


def _redis_job(tmp_path: Path, m: int, url: str, *, outage_s: float) -> Job:
    task = FakeTask({16: 1.0, 32: 0.5}, m=m)
    options = TuneOptions(lock_timeout_s=60, lock_ttl_s=5, lock_outage_s=outage_s)
    tuner = Tuner(
        Store(tmp_path / "registry", create=True),
        cpu_fingerprint(),
        timer=fake_timer(task),
        lock_backend=backend_from_url(url),
        options=options,
    )
    return Job(task, tuner)


def test_a_lock_server_gone_mid_run_delays_its_shapes_then_they_are_tuned_unlocked(
    tmp_path,
    proxy,  # noqa: F811
    monkeypatch,
    caplog,
):
    # Put aside while the server may come back, then tuned without the lock: never failed,
    # never a wait of lock_timeout_s; one warning per outage interval, not one per try.
    monkeypatch.setattr(sharing, "POLL_CAP_S", 0.05)
    jobs = [_redis_job(tmp_path, m, proxy.url, outage_s=1.0) for m in (64, 128, 256)]
    settled, started = [], time.monotonic()
    with caplog.at_level(logging.WARNING):
        for one in warm_shared(jobs, lock_timeout_s=60):
            settled.append(one)
            if len(settled) == 1:
                proxy.down()
    assert time.monotonic() - started < 15
    assert [s.outcome.source if s.outcome else s.error for s in settled] == ["tuned"] * 3
    assert [s.outcome.unlocked for s in settled if s.outcome] == [False, True, True]
    assert all(s.deferred_s >= 1.0 for s in settled[1:])
    assert [j.tuner.stats.unlocked for j in jobs] == [0, 1, 1]
    down = [r for r in caplog.records if r.name == "registry.locks" and "unreachable" in r.message]
    assert 1 <= len(down) <= 3  # many tries in those seconds: logged every 5 s at most
    unlocked = [r for r in caplog.records if "without the fleet lock" in r.message]
    assert len(unlocked) == 2


def test_a_waiting_get_tunes_unlocked_once_the_server_was_silent_for_the_outage(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    first, second = (_redis_job(tmp_path, m, url, outage_s=1.0) for m in (64, 128))
    started = time.monotonic()
    outcome = first.tuner.get(first.task)  # lock_timeout_s is 60: not waited out
    assert outcome.source == "tuned" and outcome.unlocked
    assert 1.0 <= time.monotonic() - started < 5
    started = time.monotonic()  # the server's silence is timed once, for every tuner
    outcome = second.tuner.get(second.task)
    assert outcome.source == "tuned" and outcome.unlocked
    assert time.monotonic() - started < 0.5
    assert (first.tuner.stats.unlocked, second.tuner.stats.unlocked) == (1, 1)


def test_a_silent_lock_server_never_fails_a_shape_even_past_the_lock_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(sharing, "POLL_CAP_S", 0.05)
    url = f"redis://127.0.0.1:{free_port()}/0"
    jobs = [_redis_job(tmp_path, m, url, outage_s=3.0) for m in (64, 128)]
    settled = list(warm_shared(jobs, lock_timeout_s=0.5))  # shorter than the outage
    assert [(s.error, s.outcome and s.outcome.unlocked) for s in settled] == [(None, True)] * 2


# ---- fleets of pods --------------------------------------------------------------------


def run_fleet(
    scenario: str, pods: int, ranks: int, work: Path, redis_url: str = ""
) -> list[dict[str, Any]]:
    """Every rank of every pod; the results of the ranks that exited normally."""
    env = env_without_interpreter()
    extra = [redis_url] if redis_url else []
    module = [sys.executable, "-m", "tests.warmup.tuning._fleet_pods"]
    commands = [
        ([*module, scenario, str(pods), str(ranks), str(pod), str(rank), str(work), *extra], env)
        for pod in range(pods)
        for rank in range(ranks)
    ]
    return [last_json(out) for out in run_processes(commands, timeout=240, killed_ok=True)]


def tuned_by_pod(results: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Shapes each pod tuned, from its rank 0; every rank of a pod must agree."""
    by_pod: dict[int, list[int]] = {}
    for result in results:
        tuned = sorted(s["m"] for s in result["shapes"] if s["source"] == "tuned")
        assert by_pod.setdefault(result["pod"], tuned) == tuned, "a pod's ranks disagree"
        assert sorted(s["m"] for s in result["shapes"]) == SHAPES
        assert not [s for s in result["shapes"] if s["error"]]
    return by_pod


@pytest.mark.slow
@pytest.mark.parametrize(("pods", "ranks"), [(2, 2), (4, 1)])
def test_pods_on_one_volume_each_tune_a_share_and_every_shape_once(tmp_path, pods, ranks):
    by_pod = tuned_by_pod(run_fleet("share", pods, ranks, tmp_path))
    assert len(by_pod) == pods
    counts = Counter(m for tuned in by_pod.values() for m in tuned)
    assert sorted(counts) == SHAPES and set(counts.values()) == {1}  # each once
    assert all(len(tuned) >= len(SHAPES) // pods // 2 for tuned in by_pod.values()), by_pod
    assert len(Store(tmp_path / "volume" / "registry")) == len(SHAPES)


@pytest.mark.slow
@pytest.mark.parametrize("pods", [2, 4])
def test_pods_that_share_only_redis_tune_every_shape_once(tmp_path, redis, pods):  # noqa: F811
    redis.client.flushall()
    results = run_fleet("share", pods, 1, tmp_path, redis.url)
    by_pod = tuned_by_pod(results)
    counts = Counter(m for tuned in by_pod.values() for m in tuned)
    assert sorted(counts) == SHAPES and set(counts.values()) == {1}
    assert all(by_pod.values()), by_pod
    for result in results:  # the other pod's shapes came from the remote tier
        sources = {s["source"] for s in result["shapes"]}
        assert sources == {"tuned", "remote"}, sources
    for pod in range(pods):  # and every volume holds every shape afterwards
        assert len(Store(tmp_path / f"volume-{pod}" / "registry")) == len(SHAPES)


@pytest.mark.slow
@pytest.mark.parametrize(("where", "pods"), [("volume", 2), ("redis", 2), ("volume", 4)])
def test_a_shape_whose_pod_is_killed_mid_tuning_is_taken_over(tmp_path, where, pods, request):
    url = ""
    if where == "redis":
        server = request.getfixturevalue("redis")
        server.client.flushall()
        url = server.url
    results = run_fleet("killed", pods, 1, tmp_path, url)
    assert sorted(r["pod"] for r in results) == list(range(1, pods))  # pod 0 died
    by_pod = tuned_by_pod(results)
    counts = Counter(m for tuned in by_pod.values() for m in tuned)
    assert sorted(counts) == SHAPES and set(counts.values()) == {1}  # its shape too, once
    # the one pod 0 held: put aside by every pod while pod 0 lived, then taken over by
    # one of them after it died (the others found it stored)
    held = SHAPES[0]
    for result in results:
        (shape,) = [s for s in result["shapes"] if s["m"] == held]
        assert shape["deferred_s"] > 0
    assert len([r for r in results if held in by_pod[r["pod"]]]) == 1


@pytest.mark.slow
def test_two_run_pods_on_their_own_volumes_share_through_redis(tmp_path, redis):  # noqa: F811
    """The whole path: two ``triton-warmup run`` pods of the demo manifest, each with its
    own volume, locks and remote tier on one redis: every shape tuned once, each pod's
    status ready with its phases and the remote tier's calls."""
    redis.client.flushall()
    env = env_without_interpreter(TRITON_WARMUP_LOCK_URL=redis.url, TRITON_WARMUP_DEVICE="cpu")
    argv = [sys.executable, "-m", "warmup", "run", "--manifest", str(DEMO)]
    pods = [
        (
            argv,
            {
                **env,
                "TRITON_WARMUP_VOLUME": str(tmp_path / f"volume-{pod}"),
                "TRITON_WARMUP_CREATE_VOLUME": "true",
                "TRITON_WARMUP_WORK_DIR": str(tmp_path / f"work-{pod}"),
            },
        )
        for pod in range(2)
    ]
    run_processes(pods, timeout=240)
    statuses = [RunStatus.read(tmp_path / f"work-{pod}" / "status.json") for pod in range(2)]
    tuned = Counter()
    for status in statuses:
        assert status is not None and status.ready
        shapes = {json.dumps(s.key, sort_keys=True) for s in status.shapes if s.source == "tuned"}
        tuned.update(shapes)
        assert {"rank_start", "rendezvous", "setup", "save"} <= set(status.phases)
        assert status.remote is not None and status.remote.errors == 0
    expanded = load_manifest(DEMO).entries[0].expand()
    assert len(tuned) == len(expanded) and set(tuned.values()) == {1}  # each shape once
    found_remote = sum(s.remote.hits for s in statuses)
    assert found_remote == sum(st.sources.get("remote", 0) for st in statuses) // 2
    assert sum(s.remote.published for s in statuses) == len(expanded)
