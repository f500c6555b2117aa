"""A redis lock held through outages of the lock server.

    .venv/bin/python bench/redis_outage.py [--ttl 6] [--repeats 3]

A real redis-server behind the tests' TCP proxy (tests/registry/test_redis_outage.py).
Per run: a holder that reaches redis through the proxy takes the lock (ttl 6 s); after
a random part of its renewal interval the proxy goes down (open connections reset, new
ones refused) for N s; a contender with its own direct connection tries to take the lock
all along. The holder keeps the lock until ttl + 0.5 s after the outage began, or
longer, so a lease that was not renewed would have expired on the server.

Reported per outage: renewals retried, runs where the holder kept the lock (never
``lost``), where the contender got in, where both held it at once (the contender in
while the holder still claimed it: must be 0), and the time from the end of the outage
to the holder's next successful renewal.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # the tests' proxy and redis-server

from registry.locks import Lease, backend_from_url, lock
from tests.registry.test_redis_outage import LOCK, Contender, Proxy, Redis


@dataclass
class Run:
    retried: int
    kept: bool
    contender_in: bool
    both_held: bool
    recovery_s: float | None  # None: no renewal after the outage (the lease was lost)


def one(redis: Redis, ttl: float, outage_s: float) -> Run:
    redis.client.flushall()
    proxy = Proxy(redis.port)
    try:
        with lock(LOCK, ttl=ttl, timeout=5, backend=backend_from_url(proxy.url)) as me:
            assert me is not None and me.lease is not None
            contender = Contender(redis.url, ttl, other=me)
            contender.start()
            time.sleep(random.uniform(0, ttl / 10))  # any phase against the heartbeat
            began = time.monotonic()
            proxy.outage(outage_s).join()
            recovery = _recovery(me.lease, time.monotonic(), ttl)
            time.sleep(max(0.0, began + ttl + 0.5 - time.monotonic()))
            run = Run(
                retried=me.lease.retries,
                kept=not me.lost,
                contender_in=contender.acquired.is_set(),
                both_held=contender.acquired.is_set() and contender.other_lost_then is False,
                recovery_s=recovery,
            )
        contender.done.set()
        contender.join(10)
        return run
    finally:
        proxy.close()


def _recovery(lease: Lease, up: float, ttl: float) -> float | None:
    """Seconds from ``up`` to the next successful renewal; None if none comes."""
    renewals = lease.renewals
    while lease.renewals == renewals and not lease.lost and time.monotonic() < up + ttl:
        time.sleep(0.005)
    return time.monotonic() - up if lease.renewals > renewals else None


def table(rows: dict[float, list[Run]]) -> str:
    lines = [
        "| outage s | runs | renewals retried (mean) | holder kept lock | contender got in "
        "| both held at once | recovery s (max) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for outage_s, runs in rows.items():
        recoveries = [r.recovery_s for r in runs if r.recovery_s is not None]
        cells = (
            f"{outage_s:g}",
            len(runs),
            f"{statistics.mean(r.retried for r in runs):.1f}",
            sum(r.kept for r in runs),
            sum(r.contender_in for r in runs),
            sum(r.both_held for r in runs),
            f"{max(recoveries):.2f}" if recoveries else "-",
        )
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttl", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        redis = Redis(Path(folder))
        try:
            for title, outages in (("within the ttl", (1, 2, 4, 5)), ("beyond it", (8,))):
                rows = {s: [one(redis, args.ttl, s) for _ in range(args.repeats)] for s in outages}
                print(f"\nOutages {title} (ttl {args.ttl:g} s):\n\n{table(rows)}", flush=True)
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
