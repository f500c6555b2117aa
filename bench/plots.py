"""The benches' plots: SVG drawn from a bench's result JSON, the same bytes every time.

    PYTHONPATH=. python -m bench.plots           # the figures of the bench pages again
    PYTHONPATH=. python -m bench.plots --check   # exit 1 where a stored figure is stale

A result file in ``docs/results/`` is named after the bench that wrote it:
``<bench>_<what>_<device>_<date>.json`` comes from ``bench/<bench>.py`` (:func:`bench_of`),
and ``bench.figures.DRAWINGS[<bench>]`` draws it (``result -> {name: Figure}``). A figure
is written beside its JSON as ``<stem>_<name>.svg``: a bench does that with its ``--out``
file when it runs (:func:`save_beside`), and this command does it for the files in
``FIGURES``, the ones docs/benchmarks/ shows. So the docs' pictures are what the
benches' code draws from the stored numbers, and they sit beside the numbers.

The figures are ``matplotlib.figure.Figure`` objects, never pyplot's (no global figure
state, no GUI backend); they are drawn and saved under one ``STYLE`` (a fixed
``svg.hashsalt``, text as paths) with no date in the SVG, so the same JSON gives the same
bytes with the pinned matplotlib.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH.parent / "docs" / "results"
STYLE: dict[str, Any] = {
    "svg.hashsalt": "triton-warmup",  # element ids from the content, not from a random salt
    "svg.fonttype": "path",  # glyphs as paths: no font needed to view, same on every host
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
}


def _one(*stems: str) -> dict[str, tuple[str, ...]]:
    return {stem: (f"{stem}.json",) for stem in stems}


# What the bench pages (docs/benchmarks/) show: a figure's stem -> the result files it is drawn from
# (several: their rows joined in this order, for a table the docs made of two runs).
FIGURES: dict[str, tuple[str, ...]] = {
    **_one(
        "fleet_learns_1xH200_2026-11-26_run5_niced_checked",
        "triton_remote_cache_1xH200_2026-11-26_run1",
        "compiled_model_default_1xH100_2026-11-25_run3",
        "compiled_model_agmlp_1xH100_2026-11-25_run5",
    ),
    "compiled_model_maxautotune_1xH200_2026-11-26_run8_run9": (
        "compiled_model_maxautotune_1xH200_2026-11-26_run8_sidecar.json",
        "compiled_model_maxautotune_1xH200_2026-11-26_run9_anchors.json",
    ),
    **_one(
        "compiled_model_agmlp_maxautotune_1xH200_2026-11-26_run12",
        "ag_gemm_manifest_4xH200_2026-11-28",
        "ag_gemm_full_speed_2xH200_2026-11-23",
        "ag_gemm_tuned_2xH200_2026-11-23_run1",
        "tuning_cost_1xH200_2026-11-23",
        "cold_start_2xH200_2026-11-21",
        "cold_start_1xH100_2026-11-23_run10_why",
        "serving_2xH200_2026-11-23_run3",
        "pod_ready_smallmlp_cpu_2026-11-28_smoke",
        "pod_ready_1xH100_2026-12-08_w1_blocks4_anchors",
        "pod_ready_2xH200_2026-11-28_run4_w1",
        "pod_ready_2xH200_2026-11-28_run4_w2",
        "pod_ready_2xH200_2026-11-28_run7_w1_maxautotune",
        "pod_ready_2xH200_2026-11-28_run7_w2_kernels",
        "pod_ready_2xH200_2026-11-28_run8_w2_blocks4",
        "pod_ready_4xH200_2026-11-28_w4",
    ),
}


class PlotError(ValueError):
    """A result lacks what its figure needs."""


def need(result: Any, *keys: str, where: str) -> None:
    """Raise :class:`PlotError` unless ``result`` is a mapping that holds every key."""
    if not isinstance(result, Mapping):
        raise PlotError(f"{where}: expected an object with {list(keys)}, got {type(result)}")
    missing = [key for key in keys if key not in result]
    if missing:
        raise PlotError(f"{where} has no {missing} (it has {sorted(result)}): not this figure's")


def bench_of(name: str) -> str | None:
    """The bench that wrote result file ``name``: the longest ``bench/<bench>.py`` name
    that, with an underscore, starts it (``fleet_learns_x`` is fleet_learns', not fleet's)."""
    fitting = [path.stem for path in BENCH.glob("*.py") if name.startswith(f"{path.stem}_")]
    return max(fitting, key=len, default=None)


def svgs(bench: str, result: Any) -> dict[str, bytes]:
    """``bench``'s figures of ``result`` as SVG bytes, by figure name."""
    import matplotlib

    from bench.figures import DRAWINGS

    if bench not in DRAWINGS:
        raise PlotError(f"bench/{bench}.py has no figure (figures: {sorted(DRAWINGS)})")
    with matplotlib.rc_context(STYLE):
        drawn = DRAWINGS[bench](result)
        return {name: _svg_bytes(figure) for name, figure in drawn.items()}


def _svg_bytes(figure: Any) -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def save_beside(out: Path | str | None, bench: str, result: Any) -> list[Path]:
    """Draw ``result`` and write its figures beside ``out`` (``x.json`` gives
    ``x_<name>.svg``), as a bench does after writing its result. The figures are a
    by-product of the JSON, which is already written: one that cannot be drawn (no
    matplotlib, a field missing) is reported and left out, and the bench goes on."""
    if out is None:
        return []
    out, written = Path(out), []
    try:
        for name, data in svgs(bench, result).items():
            written.append(out.with_name(f"{out.stem}_{name}.svg"))
            _write(written[-1], data)
    except Exception as error:  # the JSON is the record: never fail a bench on its plot
        print(f"plots not drawn: {type(error).__name__}: {error}", flush=True)
        return []
    print(f"plots: {', '.join(map(str, written))}", flush=True)
    return written


def _write(path: Path, data: bytes) -> None:
    from registry.core import atomic

    atomic.write_bytes(path, data)


def load(names: tuple[str, ...], folder: Path = RESULTS) -> Any:
    """The result drawn from ``names`` in ``folder``: one file's JSON, or several files'
    rows joined in order (each must hold a list of rows)."""
    results = [json.loads((folder / name).read_text()) for name in names]
    if len(results) == 1:
        return results[0]
    if not all(isinstance(result, list) for result in results):
        raise PlotError(f"{list(names)}: only lists of rows can be joined into one figure")
    return [row for result in results for row in result]


def render(results: Path = RESULTS) -> dict[Path, bytes]:
    """Every figure of ``FIGURES``, drawn from the files in ``results``: path -> SVG."""
    drawn: dict[Path, bytes] = {}
    for stem, names in FIGURES.items():
        bench = bench_of(names[0])
        if bench is None:
            raise PlotError(f"{names[0]}: no bench/<bench>.py starts its name")
        for name, data in svgs(bench, load(names, results)).items():
            drawn[results / f"{stem}_{name}.svg"] = data
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of JSON")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # the figures never reach pyplot; no GUI backend all the same
    drawn = render(args.results)
    differ = [path for path, data in drawn.items() if _stored(path) != data]
    unknown = sorted(set(args.results.glob("*.svg")) - set(drawn))
    if args.check:
        for path in differ:
            print(f"stale: {path.name} (run: PYTHONPATH=. python -m bench.plots)")
    else:
        for path in differ:
            _write(path, drawn[path])
            print(f"drew {path.name}")
    for path in unknown:
        print(f"not a figure of FIGURES (add its JSON there, or remove it): {path.name}")
    print(f"{len(drawn)} figures, {len(differ)} {'stale' if args.check else 'redrawn'}")
    return 1 if unknown or (args.check and differ) else 0


def _stored(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
