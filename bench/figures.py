"""The benches' figures, one drawing per bench: ``result -> {name: Figure}``.

A drawing reads only the result JSON the bench wrote (``--out``), as ``bench/targets.py``
judges it, so drawing imports neither torch nor Triton (``bench/ag_gemm.py`` imports
both at its top). :mod:`bench.plots` saves the figures as SVG; a result that lacks a field
a drawing needs raises :class:`bench.plots.PlotError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bench.plots import PlotError, need
from bench.targets import FIRST_OVER_STEADY, FUSED, ratio

Drawing = Callable[[Any], dict[str, Figure]]
GREY = "#b0b0b0"


def _figure(
    width: float, height: float, *, left: float, right: float, top: float, bottom: float
) -> Figure:
    """A figure whose axes keep these margins, in inches: set by hand, not by a layout
    engine, which draws every figure twice to measure it (the docs check draws them all)."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height
    )
    return fig


def _legend_right(fig: Figure, handles: list[Any], labels: list[str], right: float) -> None:
    """The figure's legend in its right margin (``right`` inches wide)."""
    x = 1 - (right - 0.1) / fig.get_figwidth()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(x, 0.5))


def _log2_ticks(ax: Axes, values: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(values)), [str(v) for v in sorted(set(values))])
    ax.minorticks_off()


def _stacked(
    ax: Axes,
    bars: dict[str, list[float]],
    parts: list[tuple[str, str]],
    marks: dict[str, list[float]] | None = None,
    texts: dict[str, str] | None = None,
) -> None:
    """Horizontal bars, the first on top; ``bars[label][j]`` is the bar's part j, in
    ``parts[j]``'s colour (a part no bar has stays out of the legend); ``marks[label]``:
    values ticked across the bar (each repeat's total); ``texts[label]``: written at the
    bar's end, bold (its total in seconds by default)."""
    labels, marks = list(bars), marks or {}
    for j, (part, colour) in enumerate(parts):
        widths = [bars[label][j] for label in labels]
        lefts = [sum(bars[label][:j]) for label in labels]
        shown = part if any(widths) else None
        ax.barh(labels, widths, left=lefts, color=colour, label=shown, height=0.6)
    for label in labels:
        ticks = marks.get(label, [])
        ax.plot(ticks, [label] * len(ticks), "k|", markersize=14)
        end = max([sum(bars[label]), *ticks])
        said = texts[label] if texts else f"{sum(bars[label]):.2f} s"
        ax.annotate(f" {said}", (end, label), va="center", fontweight="bold" if texts else None)
    ax.set_xlim(0, 1.15 * max(max([sum(bars[b]), *marks.get(b, [])]) for b in labels))
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)


def _clip_outlier(ax: Axes, labels: list[str], totals: list[float], texts: list[str]) -> None:
    """A bar more than 3x the next longest is cut at 1.3x that one, its text written
    inside at the cut, so that the other bars stay readable."""
    ordered = sorted(totals)
    if len(ordered) < 2 or ordered[-1] <= 3 * ordered[-2]:
        return
    edge = 1.3 * ordered[-2]
    ax.set_xlim(0, edge)
    for label, total, text in zip(labels, totals, texts, strict=True):
        if total > edge:
            ax.annotate(
                f"{text} →", (edge, label), ha="right", va="center", color="white", weight="bold"
            )


# ---- bench/ag_gemm.py -------------------------------------------------------------------

AG_OPS = (  # (key in a row's "us", label, colour)
    ("nccl_cublas", "NCCL + cuBLAS (the baseline)", "C0"),
    ("tuned", "tuned op (the tuner's winner)", "C1"),
    (FUSED, "fused op (its best config)", "C2"),
    ("torch_fused", "torch fused_all_gather_matmul", "C3"),
)
MARKERS = "osD^vP*X"


def ag_gemm(result: dict[str, Any]) -> dict[str, Figure]:
    """The ops' median µs against M, and the baseline's time over each op's: points of
    one N and K joined, one marker per N and K."""
    need(result, "rows", "world", "gpu", where="bench/ag_gemm.py result")
    rows = result["rows"]
    if not rows:
        raise PlotError("bench/ag_gemm.py result has no rows: no shape was measured")
    for i, row in enumerate(rows):
        need(row, "shape", "us", where=f"rows[{i}]")
        need(row["us"], "tuned", "nccl_cublas", where=f"rows[{i}].us")
    families = sorted({tuple(row["shape"][1:]) for row in rows})
    fig = _figure(9.5, 4.0, left=0.55, right=2.5, top=0.55, bottom=0.75)
    times, ratios = fig.subplots(1, 2, gridspec_kw={"wspace": 0.22})
    for key, _, colour in AG_OPS:
        _ag_series(times, rows, families, colour, lambda row, k=key: row["us"].get(k))
    for key, _, colour in AG_OPS[1:]:
        _ag_series(ratios, rows, families, colour, lambda row, k=key: ratio(row, "nccl_cublas", k))
    graph = _ag_series(
        ratios,
        rows,
        families,
        "C2",
        lambda row: ratio(row, "graph nccl_cublas", "graph fused"),
        dashed=True,
    )
    ratios.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    times.set_yscale("log")
    times.set(title="median µs (max over ranks, L2 flushed)", xlabel="M (rows in all)")
    ratios.set(title="NCCL + cuBLAS ÷ op: above 1, faster than the baseline")
    ratios.set(xlabel="M (rows in all)")
    for ax in (times, ratios):
        _log2_ticks(ax, [row["shape"][0] for row in rows])
        ax.tick_params(axis="x", labelrotation=45)
    handles = [Line2D([], [], color=c, marker="o", label=label) for _, label, c in AG_OPS]
    if graph:
        handles.append(Line2D([], [], color="C2", linestyle="--", label="fused, graph-replayed"))
    handles += [
        Line2D([], [], color="black", marker=m, linestyle="", label=f"N {n}, K {k}")
        for (n, k), m in zip(families, MARKERS, strict=False)
    ]
    _legend_right(fig, handles, [h.get_label() for h in handles], right=2.5)
    fig.suptitle(f"AllGather-GEMM on {result['world']} x {result['gpu']}, bf16, N per rank")
    return {"by_m": fig}


def _ag_series(
    ax: Axes,
    rows: list[dict[str, Any]],
    families: list[tuple[int, ...]],
    colour: str,
    value: Callable[[dict[str, Any]], float | None],
    *,
    dashed: bool = False,
) -> bool:
    """One op's points, a line per N and K; False if no row has the op."""
    drawn = False
    for family, marker in zip(families, MARKERS, strict=False):
        points = sorted(
            (row["shape"][0], value(row))
            for row in rows
            if tuple(row["shape"][1:]) == family and value(row) is not None
        )
        if points:
            ms, ys = zip(*points, strict=True)
            style = "--" if dashed else "-"
            ax.plot(ms, ys, style, color=colour, marker=marker, markersize=4, linewidth=1)
            drawn = True
    return drawn


# ---- bench/cold_start.py ----------------------------------------------------------------

PHASE_COLOURS = {  # tab10's, one each; a phase the bench adds later is grey
    "imports": "#9edae5",
    "rank_start": "#1f77b4",
    "rendezvous": "#ff7f0e",
    "prepare": "#9467bd",
    "setup": "#2ca02c",
    "lookup": "#17becf",
    "tune": "#d62728",
    "compile+check": "#e377c2",
    "lock_wait": "#bcbd22",
    "exit": "#7f7f7f",
    "save": "#8c564b",
    "other": "#dddddd",
}


def cold_start(result: dict[str, Any]) -> dict[str, Figure]:
    """Time to ready, cold, warm and the floor, split by phase as the bench's table pairs
    the warm run's phases with the floor's; below, warm and floor alone, each repeat's
    total marked. A run from before the phases were kept is drawn unsplit."""
    need(result, "cold_s", "warm_s", "floor_s", "world", "shapes", where="bench/cold_start.py")
    repeats = f" (median of {result['repeats']})" if "repeats" in result else ""
    runs = {  # label: (its phases, its total, each repeat's total)
        "cold (empty volume)": ("cold_phases", "cold_s", ""),
        f"warm{repeats}": ("warm_phases", "warm_s", "warm_runs_s"),
        f"floor{repeats}": ("floor_phases", "floor_s", "floor_runs_s"),
    }
    if all(result.get(phases) for phases, _, _ in runs.values()):
        parts, bars = _cold_start_phases(result, runs)
    else:
        parts = [("not split by phase (an older run)", GREY)]
        bars = {label: [result[total]] for label, (_, total, _) in runs.items()}
    fig = _figure(9.0, 4.2, left=1.5, right=1.45, top=0.35, bottom=0.5)
    whole, zoom = fig.subplots(2, 1, height_ratios=[3, 2], gridspec_kw={"hspace": 0.35})
    _stacked(whole, bars, parts)
    marks = {label: result[each] for label, (_, _, each) in runs.items() if each in result}
    _stacked(zoom, {label: bars[label] for label in list(bars)[1:]}, parts, marks)
    ticked = " (|: each repeat's total)" if marks else ""
    zoom.set_xlabel(f"seconds, process start to ready{ticked}")
    _legend_right(fig, *whole.get_legend_handles_labels(), right=1.45)
    shapes = len(result["shapes"])
    fig.suptitle(f"Time to ready: {shapes} AllGather-GEMM shapes at world {result['world']}")
    return {"phases": fig}


def _cold_start_phases(
    result: dict[str, Any], runs: dict[str, tuple[str, str, str]]
) -> tuple[list[tuple[str, str]], dict[str, list[float]]]:
    """The parts of each bar: ``bench.cold_start.VS_FLOOR``'s rows (a newer phase after
    them), less those beside the ranks' start (restore), then what no phase holds."""
    from bench.cold_start import VS_FLOOR
    from warmup.run.phases import OVERLAPPING

    listed = {name for _, names, _, _ in VS_FLOOR for name in names}
    newer = sorted({*result["cold_phases"], *result["warm_phases"]} - listed)
    rows = [(row, names, floor) for row, names, floor, _ in VS_FLOOR]
    rows += [(name, (name,), None) for name in newer]
    rows = [row for row in rows if row[0] not in OVERLAPPING]
    bars = {}
    for label, (phases_key, total_key, _) in runs.items():
        phases = result[phases_key]
        if phases_key == "floor_phases":  # the floor's own names, paired as the bench pairs them
            widths = [float(phases.get(floor or "", 0.0)) for _, _, floor in rows]
        else:
            widths = [float(sum(phases.get(n, 0.0) for n in names)) for _, names, _ in rows]
        bars[label] = [*widths, max(0.0, result[total_key] - sum(widths))]
    parts = [(row, PHASE_COLOURS.get(row, GREY)) for row, _, _ in rows]
    return [*parts, ("other", PHASE_COLOURS["other"])], bars


# ---- bench/compiled_model.py ------------------------------------------------------------

CASE_LABELS = {
    "cold": "nothing (cold)",
    "same_host": "Inductor's own dirs,\nsame host (the anchor)",
    "sidecar": "the sidecar's artifacts,\nat another path",
    "megacache": "Mega-Cache blob",
    "eager": "uncompiled (eager)",
}
SERVER_PARTS = [  # (label, the phases it adds up, colour)
    ("import", ("import",), "#c7c7c7"),
    ("restore (sidecar) or load (Mega-Cache)", ("restore", "load"), "C0"),
    ("build (CUDA context, weights)", ("build",), "#e0e0e0"),
    ("first calls (one a batch shape)", ("first_calls",), "C3"),
]


def compiled_model(rows: list[dict[str, Any]]) -> dict[str, Figure]:
    """A fresh server process's seconds by phase, one bar per case (what it found), one
    figure per model; each bar ends in its restore or load plus first calls, the figure
    the targets judge, and names what the process compiled."""
    if not isinstance(rows, list):
        raise PlotError(f"bench/compiled_model.py result: a list of rows, got {type(rows)}")
    servers = [r for r in rows if r.get("case") in CASE_LABELS and not r.get("error")]
    if not servers:
        raise PlotError("bench/compiled_model.py result has no server case (cold, sidecar...)")
    for i, row in enumerate(servers):
        need(row, "model", "phases", "counts", where=f"server row {i} ({row['case']})")
        need(row["phases"], "import", "first_calls", where=f"server row {i}.phases")
    models = _by_model(servers)
    for model, cases in models.items():
        named = [row["case"] for row in cases]
        if len(set(named)) < len(named):
            raise PlotError(f"{model}: a case twice in {named}; join only runs of other cases")
    order = list(CASE_LABELS)
    return {
        model: _server_bars(model, sorted(cases, key=lambda r: order.index(r["case"])))
        for model, cases in models.items()
    }


def _by_model(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    models: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        models.setdefault(row["model"], []).append(row)
    return models


def _server_bars(model: str, rows: list[dict[str, Any]]) -> Figure:
    fig = _figure(9.0, 0.75 * len(rows) + 1.3, left=2.85, right=0.25, top=0.35, bottom=0.9)
    ax = fig.subplots()
    bars = {
        f"{CASE_LABELS[row['case']]}\n{_compiled(row)}": [
            sum(row["phases"].get(phase, 0.0) for phase in phases) for _, phases, _ in SERVER_PARTS
        ]
        for row in rows
    }
    texts = {label: f"{w[1] + w[3]:.2f} s" for label, w in bars.items()}  # restore + first
    _stacked(ax, bars, [(part, colour) for part, _, colour in SERVER_PARTS], texts=texts)
    _clip_outlier(ax, list(bars), [sum(w) for w in bars.values()], list(texts.values()))
    ax.set_xlabel("seconds in a fresh server process (bold: restore or load + first calls)")
    fig.legend(loc="lower center", ncols=4)
    fig.suptitle(f"{model}: a fresh server's first calls, by what its process found")
    return fig


def _compiled(row: dict[str, Any]) -> str:
    if row["case"] == "eager":
        return "nothing to compile"
    counts = row["counts"]
    return (
        f"compiled: {counts.get('inductor_compiles', 0)} graphs, "
        f"{counts.get('kernel_compiles', 0)} kernels; {counts.get('autotune_runs', 0)} tuned"
    )


# ---- bench/pod_ready.py -----------------------------------------------------------------

POD_CASES = {
    "cold": "cold: no warmup,\nempty caches",
    "persisted": "Inductor + Triton dirs\npersisted (best of 3)",
    "first_pod": "first pod of a fleet\n(empty volume)",
    "warm_fleet": "warm fleet (volume\ncopied, another path)",
    "package": "warm fleet serving\ncompiled packages",
    "remote_only": "remote tier only\n(empty volume)",
    "eager": "uncompiled (eager)",
    "nccl_eager": "uncompiled, NCCL +\ncuBLAS, no serving op",
}
POD_PARTS = [  # (label, the phases it adds up: a name, or a prefix ending in a space; colour)
    ("init container (triton-warmup run)", ("init",), "C0"),
    ("server: Python start", ("python",), "#c7c7c7"),
    ("import torch", ("import_torch",), "#9edae5"),
    ("process group", ("process_group",), "#ff7f0e"),
    ("Serving()", ("serving",), "#9467bd"),
    ("serving ops made", ("op ",), "#2ca02c"),
    ("models built and primed", ("model ",), "C3"),
    ("declare_warm, ranks ready", ("declare_warm", "ready_barrier"), "#bcbd22"),
]


def pod_ready(result: dict[str, Any]) -> dict[str, Figure]:
    """Each case's pod, start to ready, one bar: the init container, then the server's
    phases (rank 0's), then what no phase holds (process launches); one figure per
    model. A case skipped or failed has no bar."""
    need(result, "pods", "setup", where="bench/pod_ready.py result")
    timed = [row for row in result["pods"] if row.get("ready_s") is not None]
    if not timed:
        raise PlotError("bench/pod_ready.py result has no timed pod (every case skipped or failed)")
    for i, row in enumerate(timed):
        need(row, "model", "case", "phases", where=f"timed pod {i}")
    order = list(POD_CASES)
    return {
        model: _pod_bars(model, sorted(rows, key=lambda r: order.index(r["case"])), result["setup"])
        for model, rows in _by_model(timed).items()
    }


def _pod_bars(model: str, rows: list[dict[str, Any]], setup: dict[str, Any]) -> Figure:
    fig = _figure(9.0, 0.7 * len(rows) + 1.5, left=1.9, right=0.25, top=0.35, bottom=1.1)
    ax = fig.subplots()
    bars, texts = {}, {}
    for row in rows:
        phases = {**row["phases"], "init": row.get("init", {}).get("wall_s", 0.0)}
        widths = [_phases_sum(phases, names) for _, names, _ in POD_PARTS]
        label = POD_CASES.get(row["case"], row["case"])
        bars[label] = [*widths, max(0.0, row["ready_s"] - sum(widths))]
        texts[label] = f"{row['ready_s']:.1f} s"
    parts = [(part, colour) for part, _, colour in POD_PARTS]
    _stacked(ax, bars, [*parts, ("other (process launches)", PHASE_COLOURS["other"])], texts=texts)
    ax.set_xlabel("seconds from the pod's start to every rank ready (rank 0's phases)")
    fig.legend(loc="lower center", ncols=4)
    where = f"{setup.get('world', '?')} x {setup.get('gpu') or setup.get('device', '?')}"
    fig.suptitle(f"{model}: a pod's time to ready, init container and server, on {where}")
    return fig


def _phases_sum(phases: dict[str, float], names: tuple[str, ...]) -> float:
    """The phases named, a name ending in a space standing for every phase it starts."""
    return sum(
        float(value)
        for phase, value in phases.items()
        if any(phase == n or (n.endswith(" ") and phase.startswith(n)) for n in names)
    )


# ---- bench/tuning_cost.py ---------------------------------------------------------------

SCENARIOS = {  # result key: (label, colour)
    "native_cold": ("native, cold (empty caches)", "C7"),
    "native_warm_cache": ("native, warm compile cache", "C7"),
    "native_cache_results": ("native, cache_results=True,\nsecond process", "C7"),
    "ours_cold": ("ours, cold (empty caches,\nempty registry)", "C0"),
    "ours_warm_cache": ("ours, warm compile cache,\nempty registry", "C0"),
    "ours_warm_registry": ("ours, warm registry", "C0"),
}


def tuning_cost(result: dict[str, Any]) -> dict[str, Figure]:
    """Each scenario's tuning seconds (first kernel call to last result) inside its
    process's whole wall time; ours name their timed repetitions."""
    need(result, "results", where="bench/tuning_cost.py result")
    found = {key: result["results"][key] for key in SCENARIOS if key in result["results"]}
    if not found:
        raise PlotError(f"bench/tuning_cost.py result has none of {list(SCENARIOS)}")
    for key, scenario in found.items():
        need(scenario, "seconds", "process_wall_seconds", where=f"results.{key}")
    fig = _figure(8.0, 3.6, left=2.0, right=0.2, top=0.35, bottom=0.5)
    ax = fig.subplots()
    labels = [SCENARIOS[key][0] for key in found]
    walls = [s["process_wall_seconds"] for s in found.values()]
    seconds = [s["seconds"] for s in found.values()]
    ax.barh(labels, walls, color="#e4e4e4", height=0.7, label="process wall (start-up too)")
    colours = [SCENARIOS[key][1] for key in found]
    ax.barh(labels, seconds, color=colours, height=0.45, label="tuning seconds")
    for label, scenario in zip(labels, found.values(), strict=True):
        runs = scenario.get("benchmark_runs")
        said = f" {scenario['seconds']:.2f} s" + (
            f", {runs} timed runs" if runs is not None else ""
        )
        ax.annotate(said, (scenario["process_wall_seconds"], label), va="center")
    ax.set_xlim(0, 1.35 * max(walls))
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("seconds (grey: native triton.autotune; blue: this project's tuner)")
    ax.legend(loc="lower right")
    shapes, gpu = len(next(iter(found.values())).get("picked", [])), result.get("gpu", "GPU")
    fig.suptitle(f"Tuning {shapes} bf16 matmul shapes: triton.autotune against ours, 1 {gpu}")
    return {"scenarios": fig}


# ---- bench/triton_remote_cache.py -------------------------------------------------------

REMOTE_MODES = {
    "compile": "compile: Triton's file cache,\nempty (the anchor)",
    "publish": "publish: tiered manager,\ncompiles and publishes",
    "remote": "remote: tiered manager,\nthe tier holds the kernels",
    "local": "local: the same folder again",
    "outage": "outage: the tier's URL\na closed port",
}


def triton_remote_cache(result: dict[str, Any]) -> dict[str, Figure]:
    """Every kernel's first launch in each mode's fresh process (a dot each, log scale),
    the mode's median marked and written as a share of the compile's."""
    need(result, "modes", where="bench/triton_remote_cache.py result")
    need(result["modes"], "compile", where="modes")
    modes = {mode: result["modes"][mode] for mode in REMOTE_MODES if mode in result["modes"]}
    for mode, found in modes.items():
        need(found, "rows", "median_s", where=f"modes.{mode}")
        for i, row in enumerate(found["rows"]):
            need(row, "first_launch_s", where=f"modes.{mode}.rows[{i}]")
    anchor = modes["compile"]["median_s"]
    fig = _figure(8.0, 3.4, left=2.0, right=0.2, top=0.35, bottom=0.5)
    ax = fig.subplots()
    for i, found in enumerate(modes.values()):
        ms = [1e3 * row["first_launch_s"] for row in found["rows"]]
        ax.plot(ms, [i] * len(ms), "o", color="C0", alpha=0.45, markersize=4)
        median = 1e3 * found["median_s"]
        ax.plot([median], [i], "|", color="black", markersize=18, markeredgewidth=2)
        ax.annotate(
            f"  median {median:.2f} ms = {found['median_s'] / anchor:.3f}x compile",
            (max(ms), i),
            va="center",
        )
    ax.set_yticks(range(len(modes)), [REMOTE_MODES[mode] for mode in modes])
    ax.set_xscale("log")
    ax.set_xlim(
        right=40 * max(1e3 * row["first_launch_s"] for m in modes.values() for row in m["rows"])
    )
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(
        "first launch of a kernel in a fresh process, ms (host: lookup, compile or load, launch)"
    )
    kernels, device = len(modes["compile"]["rows"]), result.get("device", "GPU")
    fig.suptitle(f"Triton's cache on the remote tier: {kernels} matmul kernels, 1 {device}")
    return {"first_launch": fig}


# ---- bench/serving.py -------------------------------------------------------------------


def serving(result: dict[str, Any]) -> dict[str, Figure]:
    """A first call at a new M over its M's steady latency, at p50, p99 and the maximum,
    served after warmup and with none; the target (2x) and the noise floor (the largest
    repeat call of an M already seen) drawn across."""
    need(result, "serve", "cold", "setup", where="bench/serving.py result")
    for phase in ("serve", "cold"):
        need(result[phase], "first_over_steady", where=phase)
        need(result[phase]["first_over_steady"], "median", "p99", "max", where=phase)
    stats = [("median", "p50"), ("p99", "p99"), ("max", "max")]
    fig = _figure(7.0, 3.4, left=0.65, right=0.15, top=0.35, bottom=0.35)
    ax = fig.subplots()
    for offset, (phase, label, colour) in zip(
        (-0.2, 0.2),
        (("serve", "served after warmup", "C0"), ("cold", "no warmup", "C3")),
        strict=True,
    ):
        values = [result[phase]["first_over_steady"][key] for key, _ in stats]
        xs = [i + offset for i in range(len(stats))]
        ax.bar(xs, values, width=0.38, color=colour, label=label)
        for x, value in zip(xs, values, strict=True):
            said = f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
            ax.annotate(said, (x, value), ha="center", va="bottom")
    target = f"target: {FIRST_OVER_STEADY:g}x"
    ax.axhline(FIRST_OVER_STEADY, color="black", linestyle="--", linewidth=0.8, label=target)
    noise = result["serve"].get("repeat_over_steady", {}).get("max")
    if noise is not None:
        ax.axhline(noise, color="C2", linestyle=":", label="largest repeat call (noise floor)")
    ax.set_xticks(range(len(stats)), [f"first call ÷ steady, {name}" for _, name in stats])
    ax.set_yscale("log")
    ax.set_ylabel("first call ÷ its M's steady latency")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper left")
    setup, serve = result["setup"], result["serve"]
    fig.suptitle(
        f"Serving after warmup on {setup.get('world', '?')} x {setup.get('gpu', 'GPU')}: "
        f"{serve.get('calls', 0):,} calls, {serve.get('distinct_m', 0):,} new (layer, M)"
    )
    return {"first_calls": fig}


# ---- bench/fleet_learns.py --------------------------------------------------------------

PODS = {  # result key: (label, marker, colour)
    "A": ("pod A: empty volume", "o", "C3"),
    "A_off": ("pod A-off: A's volume, no harvest", "s", "C1"),
    "C": ("pod C: A-off's volume + remote tier", "^", "C0"),
    "B": ("pod B: A's volume after the harvest", "D", "C2"),
}
KINDS = {"model": "model, batch", "user": "user kernel, n", "op": "fused op, M"}


def fleet_learns(result: dict[str, Any]) -> dict[str, Figure]:
    """Each trace request's first call in every pod, log scale: what pod A compiled and
    tuned under traffic, pod B (after the harvest) found ready."""
    need(result, "A", "B", where="bench/fleet_learns.py result")
    pods = {key: result[key] for key in PODS if key in result}
    for key, pod in pods.items():
        need(pod, "trace", where=key)
        for i, call in enumerate(pod["trace"]):
            need(call, "kind", "size", "s", where=f"{key}.trace[{i}]")
    order = [*KINDS]  # a kind the bench adds later goes last
    requests = sorted(
        {(call["kind"], call["size"]) for call in result["A"]["trace"]},
        key=lambda r: (order.index(r[0]) if r[0] in order else len(order), r[1]),
    )
    fig = _figure(9.0, 3.8, left=0.65, right=0.15, top=0.35, bottom=1.15)
    ax = fig.subplots()
    for key, pod in pods.items():
        label, marker, colour = PODS[key]
        seconds = {(call["kind"], call["size"]): call["s"] for call in pod["trace"]}
        xs = [i for i, request in enumerate(requests) if request in seconds]
        ys = [1e3 * seconds[requests[i]] for i in xs]
        ax.plot(xs, ys, marker, color=colour, label=label, markersize=5, alpha=0.85)
    ax.set_xticks(
        range(len(requests)), [f"{KINDS.get(kind, kind)} {size}" for kind, size in requests]
    )
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_yscale("log")
    ax.set_ylabel("first call, ms (call to synchronize)")
    ax.legend(loc="upper right", fontsize=7.5)
    fig.suptitle("The fleet learns: each trace request's first call, by pod")
    return {"first_calls": fig}


DRAWINGS: dict[str, Drawing] = {
    "ag_gemm": ag_gemm,
    "cold_start": cold_start,
    "compiled_model": compiled_model,
    "fleet_learns": fleet_learns,
    "pod_ready": pod_ready,
    "serving": serving,
    "triton_remote_cache": triton_remote_cache,
    "tuning_cost": tuning_cost,
}
