"""The sidecar's probes while slow clients and junk hit it (CPU, loopback, no GPU).

    .venv/bin/python bench/slow_clients.py --clients 500 --junk-per-s 200 --seconds 30

Starts ``triton-warmup serve`` (``python -m warmup serve``) in a subprocess on a temp
volume whose warmup is ready, and a load process that holds ``--clients`` connections
each sending a request head one byte every ``--drip-s`` (reconnecting when the server
cuts it) and opens ``--junk-per-s`` connections a second that send junk: a TLS hello, a
70 KB request line, a 70 KB header, HTTP/0.9, garbage. Once every slow client is
connected, this process times GET /healthz and /readyz ``--probes-per-s`` times a second
each, from a thread of its own, with a kubelet's 1 s time-out, for ``--seconds``. The
load runs in a process of its own at the lowest CPU priority: in a cluster such clients
run on other hosts, and on a 2-core machine their work would otherwise take the CPU
from the server and the probes (p99 200-350 ms at a load average of 10, 20-45 ms when
the load yields).
Prints JSON: per path the checks, failures and p50/p99/max latency in ms; the junk's
answers by status line; the server's RSS (idle, peak, growth) and peak thread count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))  # the tests' status helper

from tests.conftest import free_port, wait_for
from tests.warmup.sidecar.test_server import DEMO, ready_status
from warmup.core.settings import Settings

ROOT = Path(__file__).parents[1]
HOST = "127.0.0.1"
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: sidecar\r\nX-Slow: "  # then b"a" for ever
JUNK = [
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)) + b"\r\n",  # TLS
    b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\nHost: sidecar\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: sidecar\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n",
    b"GET /\r\n",  # HTTP/0.9
    b"\x00\xff GARBAGE \xfe\r\n\r\n",
]


# ---- the load (a process of its own) ---------------------------------------------------


class Load:
    """Slow clients and junk from one asyncio loop; counts what the server did."""

    def __init__(self, port: int, clients: int, junk_per_s: float, drip_s: float) -> None:
        self.port, self.clients, self.junk_per_s, self.drip_s = port, clients, junk_per_s, drip_s
        self.slow: dict[asyncio.StreamWriter, int] = {}  # open slow client -> bytes sent
        self.counts: Counter[str] = Counter()
        self.junk: Counter[str] = Counter()  # status line (or "none") -> count
        self.connected = 0  # slow clients that connected at least once

    async def run(self, seconds: float) -> dict[str, Any]:
        """Ramp up, print ``ready`` once every slow client is connected, load for
        ``seconds``; the counts."""
        tasks = [asyncio.create_task(self._slow_client(i)) for i in range(self.clients)]
        tasks.append(asyncio.create_task(self._drip()))
        while self.connected < self.clients:
            await asyncio.sleep(0.05)
        print("ready", flush=True)
        tasks.append(asyncio.create_task(self._junk()))
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"slow": dict(self.counts), "junk": dict(self.junk)}

    async def _slow_client(self, i: int) -> None:
        await asyncio.sleep(i * 0.002)  # a ramp, not a SYN flood on the listen backlog
        first = True
        while True:
            try:
                reader, writer = await asyncio.open_connection(HOST, self.port)
            except OSError:
                self.counts["connect_failed"] += 1
                await asyncio.sleep(0.1)
                continue
            self.connected += first
            first = False
            self.counts["connections"] += 1
            self.slow[writer] = 0
            try:
                answer = await reader.read(1024)  # whatever the server does: cut or answer
            except OSError:
                answer = b""
            finally:
                del self.slow[writer]
                writer.close()
            self.counts["cut_" + (_status(answer) or "silently")] += 1

    async def _drip(self) -> None:
        while True:
            await asyncio.sleep(self.drip_s)
            for writer, sent in list(self.slow.items()):
                byte = SLOW_HEAD[sent : sent + 1] or b"a"
                with contextlib.suppress(OSError):
                    writer.write(byte)
                self.slow[writer] = sent + 1

    async def _junk(self) -> None:
        started, sent = time.monotonic(), 0
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                task = asyncio.create_task(self._junk_one(JUNK[sent % len(JUNK)]))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
                await asyncio.sleep(max(0.0, started + sent / self.junk_per_s - time.monotonic()))
        finally:
            for task in pending:
                task.cancel()

    async def _junk_one(self, payload: bytes) -> None:
        answer = b""
        try:
            reader, writer = await asyncio.open_connection(HOST, self.port)
            try:
                writer.write(payload)
                with contextlib.suppress(OSError):
                    await writer.drain()
                answer = await asyncio.wait_for(reader.read(1024), 5.0)
            finally:
                writer.close()
        except (OSError, asyncio.TimeoutError):
            pass
        self.junk[_status(answer) or "none"] += 1


def _status(answer: bytes) -> str:
    """``"HTTP/1.1 400"``-like, or "" for no status line."""
    line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    return " ".join(line.split(" ")[:2]) if line.startswith("HTTP/") else ""


# ---- the probes and the server (this process) ------------------------------------------


class Prober(threading.Thread):
    """GET ``path`` ``per_s`` times a second with a 1 s time-out; latencies in ms."""

    def __init__(self, port: int, path: str, per_s: float) -> None:
        super().__init__(daemon=True, name=f"probe{path}")
        self.port, self.path, self.interval = port, path, 1.0 / per_s
        self.ms: list[float] = []
        self.failures: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            started = time.perf_counter()
            try:
                status = self._get()
            except (OSError, http.client.HTTPException) as e:
                self.failures[type(e).__name__] += 1
                continue
            seconds = time.perf_counter() - started
            if status != 200:
                self.failures[str(status)] += 1
            elif seconds > 1.0:  # http.client's time-out is per read: a kubelet's is in all
                self.failures["over 1 s"] += 1
            else:
                self.ms.append(seconds * 1000)

    def _get(self) -> int:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=1.0)
        try:
            connection.request("GET", self.path)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    def report(self) -> dict[str, Any]:
        ms = sorted(self.ms)
        at = lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 2) if ms else None  # noqa: E731
        checks = len(ms) + sum(self.failures.values())
        return {
            "checks": checks,
            "failures": sum(self.failures.values()),
            "failed_by": dict(self.failures),
            "p50_ms": at(0.50),
            "p99_ms": at(0.99),
            "max_ms": round(ms[-1], 2) if ms else None,
        }


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS (KiB), Threads and CPU seconds (user and system) of a process, from /proc."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "Threads"):
            fields[name] = int(value.split()[0])
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    fields["cpu_s"] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return fields


class Sampler(threading.Thread):
    """Peak RSS and thread count of a process, every 50 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.rss_kib, self.threads = pid, 0.0, 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            with contextlib.suppress(OSError):
                now = proc_status(self.pid)
                self.rss_kib = max(self.rss_kib, now["VmRSS"])
                self.threads = max(self.threads, now["Threads"])


@contextlib.contextmanager
def sidecar(folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``triton-warmup serve`` on a free local port, its warmup ready; (process, port)."""
    settings = Settings(volume=folder / "v", work_dir=folder / "w", manifest=DEMO)
    settings.paths.volume.mkdir()
    ready_status(settings)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRITON_WARMUP_")},
        "TRITON_WARMUP_VOLUME": str(settings.paths.volume),
        "TRITON_WARMUP_WORK_DIR": str(settings.paths.work_dir),
        "TRITON_WARMUP_MANIFEST": str(DEMO),
    }
    port = free_port()
    command = [sys.executable, "-m", "warmup", "serve", "--host", HOST, "--port", str(port)]
    with (folder / "server.log").open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: server.poll() is not None or _answers(port), 60)
        if server.poll() is not None or not _answers(port):
            raise RuntimeError(f"the sidecar did not start: {(folder / 'server.log').read_text()}")
        yield server, port
    finally:
        server.terminate()
        server.wait(30)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError, http.client.HTTPException):
        connection = http.client.HTTPConnection(HOST, port, timeout=1.0)
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    return False


def measure(
    clients: int,
    junk_per_s: float,
    seconds: float,
    *,
    drip_s: float = 0.5,
    probes_per_s: float = 20.0,
) -> dict[str, Any]:
    """Run a sidecar, the load and the probes; the report (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as tmp, sidecar(Path(tmp)) as (server, port):
        for _ in range(5):  # warm: the status parsed, the code paths run once
            _answers(port)
        time.sleep(1.0)  # settled: its watcher's threads started
        idle = proc_status(server.pid)
        argv = ["--load", str(port), "--clients", str(clients), "--junk-per-s", str(junk_per_s)]
        argv += ["--seconds", str(seconds), "--drip-s", str(drip_s)]
        load = subprocess.Popen(
            [sys.executable, __file__, *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert load.stdout is not None
        try:
            if load.stdout.readline().strip() != "ready":
                raise RuntimeError("the load process did not ramp up")
            sampler = Sampler(server.pid)
            probes = [Prober(port, path, probes_per_s) for path in ("/healthz", "/readyz")]
            for thread in [sampler, *probes]:
                thread.start()
            time.sleep(seconds)
            for thread in [sampler, *probes]:
                thread.stop.set()
                thread.join()
            counts = json.loads(load.stdout.read() or "{}")
        finally:
            if load.poll() is None:
                load.kill()
            load.wait()
        busy = proc_status(server.pid)["cpu_s"] - idle["cpu_s"]
        alive = server.poll() is None
    return {
        "clients": clients,
        "junk_per_s": junk_per_s,
        "seconds": seconds,
        "cpus": os.cpu_count(),
        **{probe.path.strip("/"): probe.report() for probe in probes},
        **counts,
        "server": {
            "alive": alive,
            "rss_idle_mib": round(idle["VmRSS"] / 1024, 1),
            "rss_peak_mib": round(sampler.rss_kib / 1024, 1),
            "rss_growth_mib": round((sampler.rss_kib - idle["VmRSS"]) / 1024, 1),
            "threads_idle": idle["Threads"],
            "threads_peak": sampler.threads,
            "cpu_s": round(busy, 1),  # over the ramp, the probes and the wind-down
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=500, help="slow clients held open")
    parser.add_argument("--junk-per-s", type=float, default=200.0, help="junk connections/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the probes run")
    parser.add_argument("--drip-s", type=float, default=0.5, help="seconds between a slow byte")
    parser.add_argument("--probes-per-s", type=float, default=20.0, help="per probed path")
    parser.add_argument("--load", type=int, metavar="PORT", help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()
    if args.load:  # the load process: ready, then the counts as JSON
        os.nice(19)  # clients run on other hosts: their work must not take the server's CPU
        load = Load(args.load, args.clients, args.junk_per_s, args.drip_s)
        print(json.dumps(asyncio.run(load.run(args.seconds + 1.0))), flush=True)
        return
    report = measure(
        args.clients,
        args.junk_per_s,
        args.seconds,
        drip_s=args.drip_s,
        probes_per_s=args.probes_per_s,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
