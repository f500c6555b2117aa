"""Process bodies for the concurrency tests (importable, so 'spawn' can start them)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from registry import Entry, KernelConfig, Measurement, Store, lock
from registry.locks import backend_from_url
from tests.conftest import gpu_fingerprint

SHARED_M = 999_999


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
    store = Store(root)
    for i in range(count):
        store.put(entry(worker * 1000 + i, 64))
    store.put(entry(SHARED_M, worker + 1, created=f"2026-11-21T10:00:{worker:02d}+00:00"))


def write_forever(root: str) -> None:
    store = Store(root)
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


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
