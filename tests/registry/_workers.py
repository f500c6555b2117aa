"""Process bodies for the concurrency tests (importable, so 'spawn' can start them)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from registry import Entry, KernelConfig, Measurement, RegistryError, Store, lock
from registry.bundles import bundle
from registry.families.staging import Stage
from registry.locks import backend_from_url
from tests._trust import UNSIGNED_OK
from tests.conftest import gpu_fingerprint

SHARED_M = 999_999
CHAOS_TTL_S = 1.0


def entry(m: int, block_m: int, *, created: str = "2026-11-21T10:00:00+00:00") -> Entry:
    config = KernelConfig.make({"BLOCK_M": block_m})
    return Entry.make(
        "ag_gemm",
        {"M": m, "N": 256, "K": 128},
        gpu_fingerprint(),
        config,
        measurements=(Measurement(config, 1.0 + block_m / 1000, 1.0, 1.0),),
        created=created,
    )


def write_entries(root: str, worker: int, count: int, start: float) -> None:
    """Each worker writes its own keys one by one, plus one shared key with its own config."""
    while time.time() < start:
        time.sleep(0.001)
    store = Store(root, create=True)
    for i in range(count):
        store.put(entry(worker * 1000 + i, 64))
    store.put(entry(SHARED_M, worker + 1, created=f"2026-11-21T10:00:{worker:02d}+00:00"))


def write_forever(root: str) -> None:
    store = Store(root, create=True)
    i = 0
    while True:
        store.put(entry(i, 64))
        i += 1


def count_under_lock(lock_url: str, counter: str, rounds: int, start: float) -> None:
    """Read-increment-write a counter file under the lock: any overlap loses increments."""
    backend = backend_from_url(lock_url)
    while time.time() < start:
        time.sleep(0.001)
    for _ in range(rounds):
        with lock("counter", ttl=10, timeout=60, backend=backend):
            path = Path(counter)
            value = json.loads(path.read_text()) if path.exists() else 0
            time.sleep(0.002)
            path.write_text(json.dumps(value + 1))


def hold_lock(lock_url: str, name: str, ttl: str, ready: str) -> None:
    """Take the lock, say so, then sleep until killed or stopped."""
    with lock(name, ttl=float(ttl), timeout=30, backend=backend_from_url(lock_url)):
        Path(ready).write_text("held")
        time.sleep(3600)


def hang_in(root: str, what: str, ready: str) -> None:
    """Start a put or an install of one entry and stop it for good where ``os.replace``
    would make a file whole (after the temp file is written and synced), saying so in
    ``ready``: a kill -9 there leaves what a writer killed mid-write leaves."""
    import registry.core.atomic

    def hang(*args: object) -> None:
        Path(ready).write_text(what)
        time.sleep(3600)

    registry.core.atomic.os.replace = hang  # type: ignore[assignment]
    store = Store(root, create=True)
    if what == "put":
        store.put(entry(77, 64))
    else:
        store.install([entry(78, 64)], record={"bundle": {"name": "b"}})


def hang_staging(path: str, root: str, family: str, folder: str, ready: str) -> None:
    """Install the bundle at ``path`` into the store at ``root``, ``family``'s files into
    ``folder``, and stop it for good once its first file is staged, saying so in
    ``ready``: a kill -9 there leaves what an install killed mid-read leaves."""
    write = Stage.write

    def hang(self: Stage, *args: Any) -> None:
        write(self, *args)
        Path(ready).write_text(str(self.root))
        time.sleep(3600)

    Stage.write = hang  # type: ignore[method-assign]
    bundle.install(
        Path(path), Store(root, create=True), expect=None, roots={family: Path(folder)},
        trust=UNSIGNED_OK,
    )  # fmt: skip


def hold_stage(folder: str, ready: str) -> None:
    """Stage one file in ``folder`` as a live install does, say where in ``ready``, then
    sleep until killed."""
    stage = Stage(Path(folder))
    stage.write("b.tgz", "a/one.bin", [b"1"])
    Path(ready).write_text(str(stage.root))
    time.sleep(3600)


class _Solo:
    """A one-process lockstep without torch.distributed: a chaos worker starts in a
    fraction of a second, as many of them as the test needs."""

    active, leader, rank, world = False, True, 0, 1

    def broadcast(self, value, *, what, timeout_s=None):  # type: ignore[no-untyped-def]
        return value

    def share(self, value, kind, *, what, timeout_s=None):  # type: ignore[no-untyped-def]
        return value

    def max_over_ranks(self, values, *, what):  # type: ignore[no-untyped-def]
        return list(values)

    def barrier(self, *, what):  # type: ignore[no-untyped-def]
        return None


class LoggedStore(Store):
    """A store that notes every put of a tuning in its own file: landed or refused."""

    def __init__(self, root: str, log: str, *, create: bool = False) -> None:
        super().__init__(root, create=create)
        self.log = Path(log)

    def put(self, entry, **fence):  # type: ignore[no-untyped-def]
        note = {"m": entry.key["M"], "block": entry.best.meta["BLOCK"], "t": time.time()}
        try:
            stored = super().put(entry, **fence)
        except RegistryError as e:
            _note(self.log, {**note, "put": type(e).__name__})
            raise
        _note(self.log, {**note, "put": "landed"})
        return stored


def _note(path: Path, line: dict) -> None:  # type: ignore[type-arg]
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")


def chaos_tuner(root: str, lock_url: str, log: str, phases: str, gate: str, period: str) -> None:
    """Tune the shapes of each phase (``M,M;M,M``) as a pod does (``warm_shared``: a
    shape whose lock another holds is deferred), a fake tuning that sleeps, and note
    each put and settled shape in ``log``. Says "ready" there, then waits for the file
    ``gate`` to hold the start time; phase ``i`` starts ``i * period`` s after it."""
    store, locks = LoggedStore(root, log, create=True), backend_from_url(lock_url)
    _note(store.log, {"ready": True, "t": time.time()})
    while not Path(gate).exists() or not Path(gate).read_text():
        time.sleep(0.005)
    start = float(Path(gate).read_text())
    for i, phase in enumerate(phases.split(";")):
        while time.time() < start + i * float(period):
            time.sleep(0.001)
        _note(store.log, {"phase": i, "t": time.time()})
        _tune_phase(store, locks, [int(m) for m in phase.split(",")])


def _tune_phase(store: LoggedStore, locks: Any, shapes: list[int]) -> None:
    from tests.warmup.tuning.fakes import FakeTask, fake_timer
    from warmup.tuning.sharing import Job, rotated, warm_shared
    from warmup.tuning.tuner import TuneOptions, Tuner

    options = TuneOptions(
        lock_ttl_s=CHAOS_TTL_S, lock_timeout_s=60, lock_outage_s=60, parallel_compile=False
    )
    jobs = []
    for m in rotated(shapes, random.random()):
        task = FakeTask({16: 1.0, 32: 0.5, 64: 0.7}, m=m, sleep_s=0.15)
        tuner = Tuner(
            store,
            gpu_fingerprint(),  # cpu_fingerprint() would import torch: seconds per worker
            timer=fake_timer(task),
            lockstep=_Solo(),  # type: ignore[arg-type]
            lock_backend=locks,
            options=options,
        )
        jobs.append(Job(task, tuner))
    for settled in warm_shared(jobs, lock_timeout_s=60):
        outcome = settled.outcome
        _note(
            store.log,
            {
                "m": settled.job.task.key()["M"],
                "source": outcome.source if outcome else None,
                "block": outcome.config.meta["BLOCK"] if outcome else None,
                "error": str(settled.error) if settled.error else None,
                "unstored": any(n.startswith("not stored") for n in outcome.notes)
                if outcome
                else False,
                "stopped": settled.job.tuner.stats.lock_lost,  # searches stopped: lock lost
                "t": time.time(),
            },
        )


def started(job: str, *args: str, ready: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Run ``job`` of this module in another process, and wait (60 s at most) until it
    writes a path into ``ready`` (its last argument): the process and that path."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.registry._workers", job, *args, str(ready)],
        cwd=Path(__file__).parents[2],
    )
    deadline = time.time() + 60
    while not ready.exists() or not ready.read_text():
        assert proc.poll() is None and time.time() < deadline, f"{job} never got ready"
        time.sleep(0.02)
    return proc, Path(ready.read_text())


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
