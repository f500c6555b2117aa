"""Hostile manifests: each one validated or refused in bounded time and memory (CPU).

    .venv/bin/python bench/manifest_limits.py

Each case is written to a temporary file, then read by two fresh processes:

outcome:   the real CLI, ``triton-warmup validate FILE`` (exit code and first line); it
           imports neither torch nor Triton (``kernels.shapes`` holds the kernels' rules)
parse s:   a small ``python -c`` that imports :mod:`warmup.core.manifest` and times
           ``load_manifest(FILE)`` alone
parse MiB: that process's peak RSS (``os.wait4``) above the same interpreter's when it
           only imports the module (the idle row)

Target: every case within 2 s and 200 MiB. Each process runs under a 4 GiB address-space
limit and a 60 s timeout, so a regression fails its row instead of the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "triton-warmup"
TARGET_S, TARGET_MIB = 2.0, 200
MEMORY_LIMIT = 4 << 30
TIMEOUT_S = 60
PARSE = """
import sys, time
from pathlib import Path
from warmup.core.manifest import ManifestError, load_manifest
if sys.argv[1] != "--idle":
    started = time.perf_counter()
    try:
        load_manifest(Path(sys.argv[1]))
    except ManifestError:
        pass
    print(f"{time.perf_counter() - started:.3f}")
"""
ENTRY = "  - kernel: matmul\n    dtype: bf16\n    world_size: 1\n    shapes:\n"


def manifest(shape_lines: str, entries: int = 1) -> str:
    return "version: 1\nentries:\n" + (ENTRY + shape_lines) * entries


def padded(text: str) -> str:
    """Trailing spaces up to just under the 1 MiB limit: valid YAML and JSON still."""
    return text + " " * (1_040_000 - len(text)) + "\n"


def bomb() -> str:
    """The classic "billion laughs": nine levels of nine aliases each (603 bytes)."""
    names = "abcdefghi"
    lines = [f"a: &a [{','.join(['lol'] * 9)}]"]
    for prev, name in itertools.pairwise(names):
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\n"


def dims(m: int, n: int) -> str:
    return f"      - {{M: {list(range(1, m + 1))}, N: {list(range(1, n + 1))}, K: 8}}\n"


def user_entries() -> str:
    """4096 entries of one shape each, every kind of node a manifest has (valid)."""
    one = (
        "  - kernel: matmul   # one shape per entry\n"
        "    dtype: fp16\n    world_size: 2\n    policy: fallback\n    shapes:\n"
        "      - {{M: {{start: {i}, stop: {j}, step: 1}}, N: {{pow2: [8, 8]}}, K: [{i}]}}\n"
    )
    return "version: 1\nentries:\n" + "".join(one.format(i=i, j=i + 1) for i in range(1, 4097))


def json_entries() -> str:
    """4096 entries of one shape each, as JSON (valid)."""
    entries = [
        {
            "kernel": "matmul",
            "dtype": "bf16",
            "world_size": 1,
            "shapes": [{"M": {"start": i, "stop": i + 1}, "N": {"pow2": [8, 8]}, "K": [i]}],
        }
        for i in range(1, 4097)
    ]
    return json.dumps({"version": 1, "entries": entries})


def bad_lines() -> str:
    """22,000 shape lines with an unknown field each: just under the node limit."""
    line = {"M": 8, "N": 8, "K": 8, "Q": 1}
    entry = {"kernel": "matmul", "dtype": "bf16", "world_size": 1, "shapes": [line] * 22_000}
    return json.dumps({"version": 1, "entries": [entry]})


ALIASED = "x: &e {kernel: matmul, dtype: bf16, world_size: 1, shapes: [{M: 8, N: 8, K: 8}]}\n"
CASES: list[tuple[str, Callable[[], str | bytes]]] = [
    ("10 MB of spaces", lambda: b" " * 10_000_000),
    ("10 MB of shapes", lambda: manifest("      - {M: 8, N: 8, K: 8}\n" * 370_000)),
    ("alias bomb (billion laughs)", bomb),
    ("1,000 aliased entries", lambda: ALIASED + "entries: [" + "*e, " * 999 + "*e]\n"),
    ("1,000 entries x 4096 shapes", lambda: manifest(dims(64, 64), 1000)),
    ("3000 x 3000 shapes", lambda: manifest(dims(3000, 3000))),
    (
        "a 1e9-value range",
        lambda: manifest("      - {M: {start: 1, stop: 1000000001}, N: 8, K: 8}\n"),
    ),
    ("nesting 100k deep [[[...]]]", lambda: "[" * 100_000 + "]" * 100_000),
    ("a 5000-digit int", lambda: manifest(f"      - {{M: {'7' * 5000}, N: 8, K: 8}}\n")),
    ("UTF-16", lambda: manifest("      - {M: 8, N: 8, K: 8}\n").encode("utf-16")),
    ("duplicate keys", lambda: manifest("      - {M: 8, N: 8, M: 16, K: 8}\n")),
    ("1 MiB flow list of ints", lambda: "[" + "1," * 520_000 + "1]"),
    (
        "1 MiB kernel name",
        lambda: manifest("      - {M: 8, N: 8, K: 8}\n").replace("matmul", "x" * 1_040_000),
    ),
    ("200k nodes, 22k bad shape lines", bad_lines),
    ("1 MiB JSON, 4096 entries (valid)", lambda: padded(json_entries())),
    ("1 MiB YAML, 4096 entries (valid)", lambda: padded(user_entries())),
]


@dataclass
class Run:
    code: int
    out: str
    err: str
    wall_s: float
    peak_mib: float


def run(argv: list[str]) -> Run:
    """One fresh process under the memory limit and timeout; its own peak RSS."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, preexec_fn=limit)
        timer = threading.Timer(TIMEOUT_S, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's rusage, not the max of all
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return Run(
            proc.returncode, out.read().decode(), err.read().decode(), wall, usage.ru_maxrss / 1024
        )


def outcome(done: Run) -> str:
    if done.code in (-9, 137):
        return f"killed after {done.wall_s:.0f} s"
    lines = (done.err or done.out).strip().splitlines() or [""]
    first = lines[-1] if done.code == 0 else lines[0].removeprefix("triton-warmup: error: ")
    first = first.split(": ", 1)[1] if first.startswith("/") else first  # drop the path
    return f"{done.code}: {first[:90]}"


def write_cases(folder: Path) -> list[tuple[str, Path]]:
    written = []
    for i, (name, make) in enumerate(CASES):
        data = make()
        path = folder / f"case{i}.yaml"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        written.append((name, path))
    return written


def main() -> int:
    cli = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "warmup"]
    parse = [sys.executable, "-c", PARSE]
    idle = statistics.median(run([*parse, "--idle"]).peak_mib for _ in range(3))
    print(f"idle interpreter (imports warmup.core.manifest): {idle:.0f} MiB peak RSS\n")
    print("| case | bytes | outcome (CLI exit: first line) | CLI s | parse s | parse MiB |")
    print("|---|---:|---|---:|---:|---:|")
    worst_s = worst_mib = 0.0
    with tempfile.TemporaryDirectory(prefix="manifest-limits-") as folder:
        for name, path in [
            *write_cases(Path(folder)),
            ("endless file (/dev/zero)", Path("/dev/zero")),
        ]:
            size = f"{path.stat().st_size:,}" if path.is_file() else "endless"
            shown = run([*cli, "validate", str(path)])
            parsed = run([*parse, str(path)])
            seconds = float(parsed.out) if parsed.code == 0 else float("inf")
            mib = max(0.0, parsed.peak_mib - idle)
            worst_s, worst_mib = max(worst_s, seconds), max(worst_mib, mib)
            print(
                f"| {name} | {size} | {outcome(shown)} | {shown.wall_s:.2f} | "
                f"{seconds:.3f} | {mib:.1f} |"
            )
    met = worst_s <= TARGET_S and worst_mib <= TARGET_MIB
    worst = f"worst case: {worst_s:.3f} s, {worst_mib:.1f} MiB above idle"
    print(f"\n{worst} (target {TARGET_S} s, {TARGET_MIB} MiB): {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
