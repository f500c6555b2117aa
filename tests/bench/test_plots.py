"""The benches' figures: each drawn from its stored result, the stored SVGs what the code
draws now, every one shown on its bench's page (docs/benchmarks/<bench>.md), the results
page (docs/benchmarks.md) showing some of them and nothing else, and a result without a
field a figure needs refused by that field's name."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import plots
from bench.figures import DRAWINGS
from bench.plots import FIGURES, RESULTS, PlotError

BENCHMARKS = RESULTS.parent / "benchmarks.md"  # the results page: the key figures
BENCH_PAGES = RESULTS.parent / "benchmarks"  # one page per bench: <bench>.md
FIGURE = re.compile(r"!\[[^\]]+\]\(((?:\.\./)?)(results/[^)]+\.svg)\)")


def shown(page: Path, way: str) -> list[str]:
    """The figures ``page`` shows, as ``results/<name>.svg``; every link takes ``way``
    from the page's folder to docs/ (``""`` or ``"../"``)."""
    found = FIGURE.findall(page.read_text())
    assert all(prefix == way for prefix, _ in found), f"{page.name}: a link not via {way!r}"
    return [link for _, link in found]


@pytest.fixture(scope="module")
def drawn() -> dict[Path, bytes]:
    """Every figure of the docs, drawn once from the stored JSON (the slow part: ~7 s)."""
    return plots.render()


def test_every_figure_draws_from_its_stored_json(drawn):
    stems = {stem for stem in FIGURES for path in drawn if path.name.startswith(f"{stem}_")}
    assert stems == set(FIGURES)
    assert all(data.startswith(b"<?xml") and b"</svg>" in data for data in drawn.values())
    assert {plots.bench_of(names[0]) for names in FIGURES.values()} == set(DRAWINGS)


def test_the_stored_svgs_are_what_the_code_draws_now(drawn):
    stale = sorted(p.name for p, data in drawn.items() if not p.exists() or p.read_bytes() != data)
    assert not stale, f"redraw them: PYTHONPATH=. python -m bench.plots ({stale})"
    stray = sorted(p.name for p in RESULTS.glob("*.svg") if p not in drawn)
    assert not stray, f"SVGs no figure of bench.plots.FIGURES draws: {stray}"


def test_an_svg_carries_no_date_and_a_fixed_salt(drawn):
    data = next(iter(drawn.values()))
    assert b"<dc:date>" not in data
    assert plots.STYLE["svg.hashsalt"]


def test_docs_show_every_figure_on_its_benchs_page_and_link_nothing_else(drawn):
    pages = {page.stem: shown(page, "../") for page in BENCH_PAGES.glob("*.md")}
    linked = [link for links in pages.values() for link in links]
    assert sorted(linked) == sorted(f"results/{path.name}" for path in drawn)  # each once
    astray = {link: stem for stem, links in pages.items() for link in links}
    astray = {link: stem for link, stem in astray.items() if plots.bench_of(link[8:]) != stem}
    assert not astray, f"a figure belongs on its bench's page: {astray}"
    key = shown(BENCHMARKS, "")
    assert key and set(key) <= set(linked), "the results page shows some of the figures, no other"


def test_every_result_file_is_named_after_the_bench_that_wrote_it():
    benches = {path.stem for path in (RESULTS.parents[1] / "bench").glob("*.py")}
    for path in RESULTS.glob("*.json"):
        assert path.name.startswith("probe_") or plots.bench_of(path.name) in benches, path.name
    assert plots.bench_of("fleet_learns_1xH200_run1.json") == "fleet_learns"
    assert plots.bench_of("fleet_shared_1xH100.json") == "fleet"
    assert plots.bench_of("compiled_model_default.json") == "compiled_model"
    assert plots.bench_of("probe_max_autotune.json") is None


def _stored(stem: str) -> Any:
    return plots.load(FIGURES[stem])


def _del(path: str) -> Callable[[Any], None]:
    """Deletes ``a.b.0.c`` from a result (digits index lists)."""
    *parents, last = path.split(".")

    def cut(result: Any) -> None:
        for key in parents:
            result = result[int(key)] if key.isdigit() else result[key]
        del result[int(last) if last.isdigit() else last]

    return cut


MISSING = [  # (figure stem, the cut, what the error names)
    ("ag_gemm_full_speed_2xH200_2026-11-23", _del("rows.3.us.nccl_cublas"), "nccl_cublas"),
    ("cold_start_1xH100_2026-11-23_run10_why", _del("warm_s"), "warm_s"),
    ("compiled_model_default_1xH100_2026-11-25_run3", _del("2.phases.first_calls"), "first_calls"),
    ("tuning_cost_1xH200_2026-11-23", _del("results.ours_cold.seconds"), "seconds"),
    ("triton_remote_cache_1xH200_2026-11-26_run1", _del("modes.compile"), "compile"),
    ("serving_2xH200_2026-11-23_run3", _del("cold"), "cold"),
    ("fleet_learns_1xH200_2026-11-26_run5_niced_checked", _del("B"), "B"),
]


@pytest.mark.parametrize(("stem", "cut", "named"), MISSING, ids=[m[0] for m in MISSING])
def test_a_result_without_a_field_its_figure_needs_is_refused_by_name(stem, cut, named):
    result = copy.deepcopy(_stored(stem))
    cut(result)
    with pytest.raises(PlotError, match=rf"\b{named}\b"):
        DRAWINGS[plots.bench_of(FIGURES[stem][0])](result)


def test_another_benchs_result_is_refused_not_drawn_wrong():
    with pytest.raises(PlotError, match="rows"):
        DRAWINGS["ag_gemm"](_stored("cold_start_1xH100_2026-11-23_run10_why"))
    with pytest.raises(PlotError, match="list of rows"):
        DRAWINGS["compiled_model"](_stored("serving_2xH200_2026-11-23_run3"))
    twice = _stored("compiled_model_default_1xH100_2026-11-25_run3") * 2  # one run joined twice
    with pytest.raises(PlotError, match="a case twice"):
        DRAWINGS["compiled_model"](twice)


def test_a_bench_writes_its_figures_beside_its_json(tmp_path, capsys):
    out = tmp_path / "tuning_cost.json"
    written = plots.save_beside(out, "tuning_cost", _stored("tuning_cost_1xH200_2026-11-23"))
    assert written == [tmp_path / "tuning_cost_scenarios.svg"]
    stored = RESULTS / "tuning_cost_1xH200_2026-11-23_scenarios.svg"
    assert written[0].read_bytes() == stored.read_bytes()  # the same JSON, the same bytes
    assert "plots: " in capsys.readouterr().out


def test_a_figure_that_cannot_be_drawn_never_fails_the_bench(tmp_path, capsys):
    assert plots.save_beside(tmp_path / "x.json", "tuning_cost", {"gpu": "H200"}) == []
    assert plots.save_beside(tmp_path / "x.json", "bundle_memory", {}) == []  # no figure
    assert plots.save_beside(None, "tuning_cost", {}) == []
    assert list(tmp_path.iterdir()) == []
    said = capsys.readouterr().out
    assert "plots not drawn: PlotError" in said and "results" in said and "no figure" in said
