"""The issues' targets, judged from the benches' result files: met, missed, or not measured.

    PYTHONPATH=. python bench/targets.py ag_gemm.json serving.json fleet-4x1.json ...

Reads what ``bench/ag_gemm.py``, ``bench/serving.py``, ``bench/fleet.py``,
``bench/cold_start.py`` and ``bench/pod_ready.py`` write to ``--out`` (the kind is told by
the file's content) and prints one markdown table per file:
target, the measured figures (per shape where the target is per shape), met or not. A
target none of whose shapes was measured (no row in its range, a column the run did not
time) is "not measured", never met. Exits 1 if a file cannot be judged. The AllGather-GEMM
and serving benches print the same tables at the end of a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.pod_targets import pod_ready
from bench.verdict import Verdict, per_shape

FUSED = "best fused_pull"  # the fused algorithm's best config, as bench/ag_gemm.py names it
TUNED_OVER_BASELINE = 0.98  # [2.4]: tuned op >= 0.98x NCCL + cuBLAS at every shape
FLOOR_LARGE = 1.05  # [2.5]: fused <= 1.05x the floor at >= 4096 rows
FLOOR_MEDIUM = 1.15  # [2.5]: fused <= 1.15x the floor at 1024-4095 rows
GRAPH_FROM_ROWS = 256  # [2.5]: graph-replayed fused >= 1.0x the graph-replayed baseline
TUNER_WITHIN = 0.10  # [4.3]: the tuner's recorded time within 10% of the bench's
FLOOR_LARGE_2 = 1.10  # [4.3] at two ranks: fused <= 1.10x the floor at >= 4096 rows
FLOOR_MEDIUM_2 = 1.25  # [4.3] at two ranks: ... <= 1.25x at 1024-4095 rows
FIRST_OVER_STEADY = 2.0  # [2.7]: a served first call <= 2x its M's steady latency
FIRST_P99_OVER_STEADY = 2.0  # [4.3]: ... at the p99 of the trace's first calls
WARM_OVER_FLOOR = 1.1  # [4.5]: the init container on a warm volume <= 1.1x its floor


def ratio(row: dict[str, Any], over: str, under: str, column: str = "us") -> float | None:
    """``row[column][over] / row[column][under]``, or None where either was not timed."""
    times = row.get(column, {})
    if over not in times or under not in times or not times[under]:
        return None
    return float(times[over]) / float(times[under])


def _floor(row: dict[str, Any]) -> float | None:
    times = row.get("us", {})
    if "cublas" not in times or "allgather" not in times:
        return None
    return max(float(times["cublas"]), float(times["allgather"]))


def _fused_ahead_over_floor(row: dict[str, Any]) -> float | None:
    """The fused op's device time (timed with the host ahead) over the floor."""
    floor, fused = _floor(row), row.get("us_ahead", {}).get(FUSED)
    return None if floor is None or fused is None else float(fused) / floor


def _fused_over_floor(row: dict[str, Any]) -> float | None:
    floor, fused = _floor(row), row.get("us", {}).get(FUSED)
    return None if floor is None or fused is None else float(fused) / floor


def ag_gemm(result: dict[str, Any]) -> list[Verdict]:
    """[2.4] and [2.5] on one ``bench/ag_gemm.py`` run (M counts every rank's rows)."""
    rows = result["rows"]
    large = [r for r in rows if r["shape"][0] >= 4096]
    medium = [r for r in rows if 1024 <= r["shape"][0] < 4096]
    graphed = [r for r in rows if r["shape"][0] >= GRAPH_FROM_ROWS]
    return [
        per_shape(
            f"[2.4] tuned op >= {TUNED_OVER_BASELINE}x NCCL + cuBLAS at every shape",
            rows,
            lambda r: ratio(r, "nccl_cublas", "tuned"),
            lambda x: x >= TUNED_OVER_BASELINE,
            label=lambda r: f" ({r.get('algorithm', '?')})",
        ),
        per_shape(
            f"[2.5] fused <= {FLOOR_LARGE}x the floor at >= 4096 rows",
            large,
            _fused_over_floor,
            lambda x: x <= FLOOR_LARGE,
        ),
        per_shape(
            f"[2.5] fused <= {FLOOR_MEDIUM}x the floor at 1024-4095 rows",
            medium,
            _fused_over_floor,
            lambda x: x <= FLOOR_MEDIUM,
        ),
        per_shape(
            f"[2.5] graph-replayed fused >= 1.0x the graph-replayed baseline from "
            f"{GRAPH_FROM_ROWS} rows",
            graphed,
            lambda r: ratio(r, "graph nccl_cublas", "graph fused"),
            lambda x: x >= 1.0,
        ),
        per_shape(
            "[2.5] fused faster than torch's fused op at every shape",
            rows,
            lambda r: ratio(r, "torch_fused", FUSED),
            lambda x: x > 1.0,
        ),
        *_two_ranks(rows),
    ]


def _two_ranks(rows: list[dict[str, Any]]) -> list[Verdict]:
    """[4.3]: the tuned op against NCCL + cuBLAS with the host ahead (device time), issued
    just in time (host and device), graph-replayed and in host time; the tuner's clock
    against the bench's; the fused kernel against the floor (looser than [2.5]'s)."""
    return [
        per_shape(
            f"[4.3] tuned op >= {TUNED_OVER_BASELINE}x NCCL + cuBLAS, host ahead (device time)",
            rows,
            lambda r: ratio(r, "nccl_cublas", "tuned", column="us_ahead"),
            lambda x: x >= TUNED_OVER_BASELINE,
            label=lambda r: f" ({r.get('algorithm', '?')})",
        ),
        per_shape(
            f"[4.3] tuned op >= {TUNED_OVER_BASELINE}x NCCL + cuBLAS, issued just in time "
            "(eager: host and device)",
            rows,
            lambda r: ratio(r, "nccl_cublas", "tuned", column="us_just_in_time"),
            lambda x: x >= TUNED_OVER_BASELINE,
            label=lambda r: f" ({r.get('algorithm', '?')})",
        ),
        per_shape(
            f"[4.3] graph-replayed tuned op >= {TUNED_OVER_BASELINE}x graph-replayed NCCL + cuBLAS",
            rows,
            lambda r: ratio(r, "graph nccl_cublas", "graph tuned"),
            lambda x: x >= TUNED_OVER_BASELINE,
        ),
        per_shape(
            f"[4.3] the tuned op's host time per call <= 1/{TUNED_OVER_BASELINE} of the "
            "two calls made directly",
            rows,
            lambda r: ratio(r, "tuned", "nccl_cublas", column="host_us"),
            lambda x: x <= 1 / TUNED_OVER_BASELINE,
        ),
        per_shape(
            f"[4.3] the tuner's recorded time within {TUNER_WITHIN:.0%} of the bench's "
            "(host ahead)",
            [r for r in rows if "us_ahead" in r],
            lambda r: r.get("tuner_over_bench"),
            lambda x: abs(x - 1.0) <= TUNER_WITHIN,
        ),
        per_shape(
            f"[4.3] fused with the host ahead (device time) <= {FLOOR_LARGE_2}x the floor at "
            ">= 4096 rows",
            [r for r in rows if r["shape"][0] >= 4096],
            _fused_ahead_over_floor,
            lambda x: x <= FLOOR_LARGE_2,
        ),
        per_shape(
            f"[4.3] fused with the host ahead (device time) <= {FLOOR_MEDIUM_2}x the floor at "
            "1024-4095 rows",
            [r for r in rows if 1024 <= r["shape"][0] < 4096],
            _fused_ahead_over_floor,
            lambda x: x <= FLOOR_MEDIUM_2,
        ),
        per_shape(
            f"[4.3] fused <= {FLOOR_LARGE_2}x the floor at >= 4096 rows",
            [r for r in rows if r["shape"][0] >= 4096],
            _fused_over_floor,
            lambda x: x <= FLOOR_LARGE_2,
        ),
        per_shape(
            f"[4.3] fused <= {FLOOR_MEDIUM_2}x the floor at 1024-4095 rows",
            [r for r in rows if 1024 <= r["shape"][0] < 4096],
            _fused_over_floor,
            lambda x: x <= FLOOR_MEDIUM_2,
        ),
    ]


def serving(result: dict[str, Any]) -> list[Verdict]:
    """[2.7] item 2 on one ``bench/serving.py`` run: the served trace's compiles and first
    calls (the noise floor, repeat calls of an M already seen, is given beside them)."""
    serve = result["serve"]
    compiles = serve.get("compiles_during_trace")
    first, repeat = serve["first_over_steady"], serve.get("repeat_over_steady", {})
    distinct = serve.get("distinct_m", "?")
    noise = (
        f"; repeat calls over 2x (noise floor): {repeat['over_2x']} of {repeat['calls']}"
        if repeat
        else ""
    )
    return [
        Verdict(
            "[2.7] zero compiles over the served trace",
            f"{compiles} compiles, {serve.get('cache_files_added_during_trace', '?')} "
            "cache files added",
            None if compiles is None else compiles == 0,
        ),
        Verdict(
            f"[2.7] first call <= {FIRST_OVER_STEADY}x steady",
            f"first / steady p50 {first['median']:.2f}, p99 {first['p99']:.2f}, "
            f"max {first['max']:.2f}; {first['over_2x']} of {distinct} first calls over 2x" + noise,
            first["max"] <= FIRST_OVER_STEADY,
        ),
        Verdict(
            f"[4.3] first call <= {FIRST_P99_OVER_STEADY}x steady at p99",
            f"first / steady p99 {first['p99']:.2f}",
            first["p99"] <= FIRST_P99_OVER_STEADY,
        ),
    ]


def cold_start(result: dict[str, Any]) -> list[Verdict]:
    """[4.5] on one ``bench/cold_start.py`` run: the warm init container (the median of its
    repeats) against its floor, bare ranks that only launch each shape; and a warm run
    that tunes nothing. A warm run that started no rank process (a full hit: restored,
    then exited) does less than the floor does, so the floor bounds nothing: not
    measured."""
    ratio, runs = result["warm_over_floor"], result["warm_benchmark_runs"]
    phases = result.get("warm_phases")  # absent from runs before phases were recorded
    ranks_started = phases is None or "rank_start" in phases
    return [
        Verdict(
            f"[4.5] warm run ÷ floor <= {WARM_OVER_FLOOR}",
            f"{ratio:.3f} (warm {result['warm_s']:.2f} s, floor {result['floor_s']:.2f} s; "
            f"cold {result['cold_s']:.2f} s)"
            + ("" if ranks_started else "; a full hit, no rank process: the floor is no bound"),
            ratio <= WARM_OVER_FLOOR if ranks_started else None,
        ),
        Verdict("warm run: 0 benchmark runs", f"{runs} benchmark runs", runs == 0),
    ]


def fleet(result: dict[str, Any]) -> list[Verdict]:
    """[2.6]/[2.7] on one ``bench/fleet.py`` run, two verdicts per fleet mode: every shape
    tuned exactly once with every pod ready (judged on any run), and the slowest pod
    against the solo pod (only under the bound the bench applied: GPUs, one per rank)."""
    pods, ranks, shapes = result["pods"], result["ranks"], len(result["shapes"])
    why_none = ""
    if result.get("shared_gpus"):
        why_none = "; pods shared GPUs: no time target applies"
    elif result.get("device") == "cpu":
        why_none = "; on CPU (pods share its cores): no time target applies"
    verdicts = []
    for name, mode in result["modes"].items():
        if name == "solo" or "skipped" in mode:
            continue
        fleet_of = f"{name}: {pods} pods x {ranks} rank(s)"
        tuned, ready = mode["tuned_in_fleet"], mode["all_ready"]
        verdicts.append(
            Verdict(
                f"{fleet_of}, every shape tuned exactly once, every pod ready",
                f"tuned in the fleet {tuned:g} of {shapes}; all ready: {'yes' if ready else 'no'}",
                tuned == shapes and ready,
            )
        )
        bound, ratio = mode.get("target"), mode.get("slowest_over_solo")
        measured = "-" if ratio is None else f"{ratio:.3f} ({mode['slowest_s']:.2f} s)"
        if floor := mode.get("sharing_floor"):
            measured += (
                f"; sharing floor {floor['floor_over_solo']:.3f} (costliest shape "
                f"{floor['costliest_shape_s']:.2f} s of {floor['tuning_s']:.2f} s tuning)"
            )
        verdicts.append(
            Verdict(
                f"{fleet_of}, slowest pod / solo" + (f" <= {bound}x" if bound else ""),
                measured + why_none,
                None if bound is None or ratio is None else ratio <= bound,
            )
        )
    return verdicts


def judge(result: dict[str, Any]) -> tuple[str, list[Verdict]]:
    """The bench a result came from, and its verdicts."""
    if result.get("bench") == "pod_ready":
        return "pod_ready", pod_ready(result)
    if "modes" in result:
        return "fleet", fleet(result)
    if "warm_over_floor" in result:
        return "cold_start", cold_start(result)
    if "serve" in result:
        return "serving", serving(result)
    if "rows" in result:
        return "ag_gemm", ag_gemm(result)
    raise ValueError(
        "not a result of bench/ag_gemm.py, bench/serving.py, bench/fleet.py, "
        "bench/cold_start.py or bench/pod_ready.py"
    )


def device_line(result: dict[str, Any]) -> str:
    setup = result.get("setup", result)
    gpu, world = setup.get("gpu"), setup.get("world")
    if "modes" in result:
        return f"{result['device']}, GPUs {result.get('gpus')}"
    if result.get("bench") == "pod_ready":
        return f"world {world}, {gpu or setup.get('device', '?')}"
    return f"{world} x {gpu}" if gpu else f"world {world}" if world else "?"


def table(verdicts: list[Verdict]) -> str:
    lines = ["| target | measured | met? |", "|---|---|---|"]
    lines += [f"| {v.target} | {v.measured} | {v.cell()} |" for v in verdicts]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="the verdicts as JSON")
    args = parser.parse_args(argv)
    failed, judged = 0, {}
    for path in args.results:
        try:
            result = json.loads(path.read_text())
            bench, verdicts = judge(result)
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"{path}: cannot be judged: {error!r}", file=sys.stderr)
            failed = 1
            continue
        judged[str(path)] = {"bench": bench, "verdicts": [asdict(v) for v in verdicts]}
        if not args.json:
            print(f"\n{path} ({bench}; {device_line(result)})\n\n{table(verdicts)}")
    if args.json:
        print(json.dumps(judged, indent=2))
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
