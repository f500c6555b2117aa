"""What checking a manifest costs: ``triton-warmup validate`` and a ``run`` that refuses.

    .venv/bin/python bench/validate_cost.py [--repeats N]

Each row runs the real program (``.venv/bin/triton-warmup``) in a fresh process, N times
(default 5), and reports the median and the worst wall seconds, the median CPU seconds
(user + system: what the wall time is on an idle core, whatever else the machine runs)
and the child's peak RSS (``ru_maxrss`` from ``os.wait4``: that child alone, not the
largest child so far):

valid      ``validate examples/demo.yaml`` (an AllGather-GEMM entry and a compiled model
           whose builder is a ``module:function``)
invalid    ``validate`` of a manifest with a typo'd policy, a typo'd kernel, an M that is
           not a multiple of its world size and a builder that does not exist: every
           error is expected in the one answer (exit 2)
run        ``run --device cpu`` of a manifest whose M is not a multiple of its world size,
           on an existing volume: exit 2, and whether the work folder was created

Targets (issue 3.3, item 6): validate within 0.5 s and 60 MiB, valid or not; ``run``
refuses before it touches the work folder. A validate that imports torch costs seconds
and ~300 MiB, so a regression shows as a missed target, not as noise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "triton-warmup"
TARGET_S, TARGET_MIB = 0.5, 60
INVALID = """\
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 2, policy: tunee,
     shapes: [{M: 63, N: 32, K: 32}]}
  - {kernel: ag_gem, dtype: fp32, world_size: 2, shapes: [{M: 64, N: 32, K: 32}]}
models:
  - {name: mlp, build: 'no_such_package.models:build', dims: {batch: [1, 8]},
     inputs: [{shape: [batch, 64], dtype: fp32}]}
"""
BAD_M = """\
version: 1
entries:
  - {kernel: ag_gemm, dtype: fp32, world_size: 2, shapes: [{M: [32, 63], N: 32, K: 32}]}
"""


@dataclass
class Done:
    code: int
    err: str
    wall_s: float
    cpu_s: float
    peak_mib: float


def run(argv: list[str], env: dict[str, str]) -> Done:
    """One fresh process; its wall time and its own peak RSS."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall, cpu = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
    return Done(proc.returncode, err, wall, cpu, usage.ru_maxrss / 1024)


def row(name: str, runs: list[Done], note: str) -> tuple[str, bool]:
    seconds = [r.wall_s for r in runs]
    mib = [r.peak_mib for r in runs]
    codes = sorted({r.code for r in runs})
    cpu = statistics.median(r.cpu_s for r in runs)
    line = (
        f"| {name} | {codes} | {statistics.median(seconds):.2f} | {max(seconds):.2f} | "
        f"{cpu:.2f} | {statistics.median(mib):.0f} | {max(mib):.0f} | {note} |"
    )
    return line, max(seconds) <= TARGET_S and max(mib) <= TARGET_MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    program = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "warmup"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_WARMUP_")}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| case | exit | median s | worst s | CPU s | median MiB | worst MiB | note |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    met = True
    with tempfile.TemporaryDirectory(prefix="validate-cost-") as folder:
        invalid, bad_m = Path(folder) / "invalid.yaml", Path(folder) / "bad_m.yaml"
        invalid.write_text(INVALID)
        bad_m.write_text(BAD_M)
        valid = ROOT / "examples" / "demo.yaml"
        for name, path in (("validate valid", valid), ("validate invalid", invalid)):
            runs = [run([*program, "validate", str(path)], env) for _ in range(args.repeats)]
            errors = len(runs[-1].err.strip().splitlines())
            line, ok = row(name, runs, f"{errors} error line(s)" if errors else "")
            met = met and ok
            print(line)
        work, volume = Path(folder) / "work", Path(folder) / "volume"
        volume.mkdir()
        pod = {**env, "TRITON_WARMUP_WORK_DIR": str(work), "TRITON_WARMUP_VOLUME": str(volume)}
        runs = []
        for _ in range(args.repeats):
            shutil.rmtree(work, ignore_errors=True)
            argv = [*program, "run", "--device", "cpu", "--manifest", str(bad_m)]
            runs.append(run(argv, pod))
            touched = work.exists()
            met = met and not touched and runs[-1].code == 2
        line, _ = row("run, M not a multiple", runs, f"work folder created: {touched}")
        print(line)
    print(
        f"\ntargets: validate within {TARGET_S} s and {TARGET_MIB} MiB; run refuses "
        f"(exit 2) before the work folder exists: {'met' if met else 'MISSED'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
