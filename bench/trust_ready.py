"""What trust adds to a warm pod's time to ready: the same pod with signatures required
(every value it takes from Redis verified) and with the opt-out
(``TRITON_WARMUP_ALLOW_UNSIGNED=true``: no signature checked).

    .venv/bin/python bench/trust_ready.py [--repeats 3] [--redis-server PATH]

On CPU, with the demo's manifest (``examples/demo.yaml``: 3 AllGather-GEMM shapes at
world 2 and a compiled MLP) and a redis-server this bench starts:

1. a first pod (its own volume) tunes and compiles everything, and publishes it to the
   Redis tier signed by the fleet's key;
2. ``remote``: a new pod on a new node (empty volume, empty work folder) runs
   ``triton-warmup run`` and takes everything from Redis: the host record, tuned
   entries, the model's index and files (a full hit from the remote tier: no rank
   starts); its wall time from process start to exit (ready);
3. ``volume``: the same pod again with a new work folder on the volume that step 2
   filled: a full hit, restored without a rank.

Steps 2 and 3 alternate between ``TRITON_WARMUP_TRUSTED_KEYS`` set (the fleet's public
key: signatures required) and unset, ``--repeats`` times each; the medians and their
ratio are printed as JSON. Both modes sign what they publish (the chart gives every pod
the key). Beside them, in this process, what the trust itself costs: loading the trusted
keys folder, and verifying one value (median of 1,000). About 2 minutes on 2 cores with
the default 9 repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import redis_server  # noqa: E402
from registry.trust import signing  # noqa: E402

MANIFEST = ROOT / "examples" / "demo.yaml"


def pod_env(url: str, volume: Path, work: Path, keys: Path, *, trusted: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(work / "tmp"),  # nothing left in /tmp; Inductor's header included
        "TRITON_INTERPRET": "1",
        "TRITON_WARMUP_MANIFEST": str(MANIFEST),
        "TRITON_WARMUP_VOLUME": str(volume),
        "TRITON_WARMUP_CREATE_VOLUME": "true",
        "TRITON_WARMUP_WORK_DIR": str(work),
        "TRITON_WARMUP_DEVICE": "cpu",
        "TRITON_WARMUP_LOCK_URL": url,
        "TRITON_WARMUP_SIGNING_KEY": str(keys / "fleet.key"),
    }
    env.pop("TRITON_WARMUP_TRUSTED_KEYS", None)
    if trusted:
        env["TRITON_WARMUP_TRUSTED_KEYS"] = str(keys / "trusted")
    else:  # the opt-out: with no key configured, code from Redis would be refused
        env["TRITON_WARMUP_ALLOW_UNSIGNED"] = "true"
    return env


def run_pod(env: dict[str, str]) -> dict[str, Any]:
    """``triton-warmup run`` in a new process: its wall time and what its status says
    (``refused``: values the pod logged as refused, which must stay 0)."""
    Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"run exited {done.returncode}: {done.stderr[-3000:]}")
    status = json.loads((Path(env["TRITON_WARMUP_WORK_DIR"]) / "status.json").read_text())
    sources: dict[str, int] = {}
    for shape in status.get("shapes", []):
        sources[shape["source"]] = sources.get(shape["source"], 0) + 1
    refused = sum(line.count(" refused: ") for line in done.stderr.splitlines())
    return {
        "seconds": seconds,
        "full_hit": bool(status.get("full_hit")),
        "sources": sources,
        "refused": refused,
    }


def trust_costs(keys: Path) -> dict[str, float]:
    """Loading the trusted keys and verifying one signed entry-sized value, in ms."""
    from registry.trust.remote_signature import seal, unseal

    def median_ms(fn: Any, n: int) -> float:
        times = []
        for _ in range(n):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e3

    trust = signing.Trust.load(keys / "trusted", signing_key=keys / "fleet.key")
    value = seal(trust, "triton-warmup:entry:k:1", "f", b"x" * 4096)
    return {
        "load_trusted_keys_ms": round(
            median_ms(lambda: signing.trusted_keys(keys / "trusted"), 100), 4
        ),
        "verify_one_value_ms": round(
            median_ms(
                lambda: unseal(trust, "triton-warmup:entry:k:1", "f", value, code=False), 1000
            ),
            4,
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trust-ready-"))
    try:
        keys = work / "keys"
        signing.generate(keys, "fleet")
        (keys / "trusted").mkdir()
        shutil.copy(keys / "fleet.pub", keys / "trusted" / "fleet.pub")
        with redis_server(args.redis_server, work / "redis") as url:
            first = run_pod(pod_env(url, work / "v0", work / "w0", keys, trusted=True))
            runs: dict[str, list[dict[str, Any]]] = {}
            for i in range(args.repeats):
                for trusted in (i % 2 == 0, i % 2 == 1):  # alternate which mode goes first
                    mode = "trusted" if trusted else "untrusted"
                    volume = work / f"v-{mode}-{i}"
                    env = pod_env(url, volume, work / f"w-{mode}-{i}", keys, trusted=trusted)
                    runs.setdefault(f"remote_{mode}", []).append(run_pod(env))
                    env = pod_env(url, volume, work / f"w2-{mode}-{i}", keys, trusted=trusted)
                    runs.setdefault(f"volume_{mode}", []).append(run_pod(env))
        costs = trust_costs(keys)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {
        "first_pod_s": round(first["seconds"], 2),
        "repeats": args.repeats,
        "trust_costs": costs,
    }
    for case in ("remote", "volume"):
        medians = {
            mode: statistics.median(r["seconds"] for r in runs[f"{case}_{mode}"])
            for mode in ("untrusted", "trusted")
        }
        out[case] = {
            "untrusted_s": round(medians["untrusted"], 3),
            "trusted_s": round(medians["trusted"], 3),
            "added": round(medians["trusted"] / medians["untrusted"] - 1, 4),
            "full_hits": sum(r["full_hit"] for r in runs[f"{case}_trusted"]),
            "refused": sum(r["refused"] for r in runs[f"{case}_trusted"]),
            "seconds_trusted": [round(r["seconds"], 3) for r in runs[f"{case}_trusted"]],
            "seconds_untrusted": [round(r["seconds"], 3) for r in runs[f"{case}_untrusted"]],
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
