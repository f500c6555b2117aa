"""Chaos on the lock server while pods tune: a real redis-server restarted empty,
restarted from its snapshot, and frozen (SIGSTOP) past the lock's ttl. Holders lose
their locks while they tune and others take them; a holder that sees its loss stops its
search, the store's fence lets exactly one tuning of each shape land, and every pod ends
with that result."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry import Store
from registry.locks import backend_from_url
from tests.conftest import free_port, gpu_fingerprint
from tests.registry._workers import CHAOS_TTL_S

ROOT = Path(__file__).parents[2]
WORKERS = 4
PHASES = [(64, 128), (192, 256), (320, 384)]  # two shapes each, four workers
PERIOD_S = 5.0  # a phase's tuning takes about 3 s, and up to 1.5 s more after chaos
TTL_S = CHAOS_TTL_S
BEST = 32  # the fake's fastest block: every tuning of every shape finds it


class Server:
    """A redis-server on one port that a test restarts, empty or from its snapshot."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = backend_from_url(self.url).client  # type: ignore[attr-defined]
        self.start()

    def start(self) -> None:
        server = shutil.which("redis-server")
        assert server is not None
        options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), *options, "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not self._answers():
            assert self.proc.poll() is None and time.monotonic() < deadline, "no redis-server"
            time.sleep(0.02)

    def restart(self, *, persisted: bool, down_s: float = 0.3) -> None:
        """Kill -9 and start again after ``down_s``: empty, or from the last snapshot
        (``client.save()``; what was written after it is lost, as with a real one)."""
        self.kill()
        if not persisted:
            (self.folder / "dump.rdb").unlink(missing_ok=True)
        time.sleep(down_s)
        self.start()

    def freeze(self, seconds: float) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def _answers(self) -> bool:
        """Whether our redis-server answers: the pid it reports is the one we started
        (another test's server on a reused port is never taken for it)."""
        assert self.proc is not None
        try:
            return int(self.client.info("server")["process_id"]) == self.proc.pid
        except Exception:
            return False


@pytest.fixture
def server(restartable_server):
    """This module's redis-server, which its tests kill and restart (conftest's)."""
    return restartable_server


def _lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _all_ready(logs: list[Path], procs: list[subprocess.Popen[bytes]], gate: Path) -> float:
    """Wait until every worker has started, then open the gate: the start time."""
    deadline = time.monotonic() + 20
    while not all(any("ready" in line for line in _lines(log)) for log in logs):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.02)
    start = time.time() + 0.2
    gate.write_text(str(start))
    return start


def _at(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))


@pytest.mark.slow
def test_chaos_on_the_lock_server_lands_one_tuning_per_shape(server, tmp_path):
    """Three phases, two shapes each, four workers: two tune while two wait for their
    locks, and chaos strikes 0.5 s into the tuning (which takes about 3 s)."""
    started = time.monotonic()
    root = tmp_path / "registry"
    logs = [tmp_path / f"worker-{w}.jsonl" for w in range(WORKERS)]
    gate = tmp_path / "start"
    phases = ";".join(",".join(map(str, phase)) for phase in PHASES)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.registry._workers",
                "chaos_tuner",
                str(root),
                server.url,
                str(log),
                phases,
                str(gate),
                str(PERIOD_S),
            ],
            cwd=ROOT,
        )
        for log in logs
    ]
    try:
        start = _all_ready(logs, procs, gate)
        _at(start + 0.5)
        server.restart(persisted=False)  # every lock key gone: the holders lose theirs
        _at(start + PERIOD_S - 0.2)
        server.client.save()  # a snapshot before phase 2's locks are taken
        _at(start + PERIOD_S + 0.5)
        server.restart(persisted=True)  # back to the snapshot: phase 2's locks gone
        _at(start + 2 * PERIOD_S + 0.5)
        server.freeze(TTL_S * 1.5)  # past the ttl: every holder's lease ends
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0] * WORKERS
    lines = [line for log in logs for line in _lines(log)]
    puts = [line for line in lines if "put" in line]
    landed = sorted(line["m"] for line in puts if line["put"] == "landed")
    refused = [line for line in puts if line["put"] != "landed"]
    settled = [line for line in lines if "source" in line]
    shapes = sorted(m for phase in PHASES for m in phase)
    stopped = sum(line.get("stopped", 0) for line in settled)
    print(
        f"chaos: {len(puts)} puts, {len(refused)} refused, "
        f"{sum(1 for line in settled if line.get('unstored'))} not stored (lock lost), "
        f"{stopped} searches stopped (lock lost), {time.monotonic() - started:.1f} s in all"
    )
    assert landed == shapes  # exactly one tuning of each shape landed
    # a holder that learns of its loss while searching stops; after its search, it
    # stores nothing until it holds the lock again; one that never learns is refused
    unstored = [line for line in settled if line.get("unstored")]
    assert refused or unstored or stopped, "chaos never took a lock from a holder: tested nothing"
    assert [line["error"] for line in settled] == [None] * (WORKERS * len(shapes))
    assert {(line["m"], line["block"]) for line in settled} == {(m, BEST) for m in shapes}
    store = Store(root, create=True)
    fingerprint = gpu_fingerprint().with_kernel("f" * 64)
    for m in shapes:
        entry = store.lookup("fake_gemm", {"M": m, "dtype": "bf16"}, fingerprint)
        assert entry is not None and entry.best.meta["BLOCK"] == BEST
    assert time.monotonic() - started < 40  # about 20 s: 3 phases of 5 s, and the starts
