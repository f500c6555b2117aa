"""Progress of the compiled models' warm (``warmup.compiled.progress``): each model's
restore, build, every shape and its end told to the callback as they happen, on both the
compile and the restore path; shown as a bar on a terminal and as log lines otherwise."""

from __future__ import annotations

import io
import logging
import re

import pytest

from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteStats
from tests.conftest import settings_for
from tests.warmup.compiled.test_failures import warm_with
from warmup.compiled import warm
from warmup.compiled.progress import ModelStep, model_progress_printer
from warmup.core.manifest import parse_manifest
from warmup.core.services import Services

MODELS = "tests.warmup.compiled.models"


def manifest(build: str, dims: str = "{batch: [1, 2, 3]}") -> str:
    return (
        f"version: 1\nmodels:\n  - name: m\n    build: {MODELS}:{build}\n    dims: {dims}\n"
        "    inputs: [{shape: [batch, 8], dtype: fp32}]\n"
    )


def test_every_step_of_a_compile_then_of_a_restore_is_told_as_it_ends(tmp_path):
    told: list[ModelStep] = []
    volume = tmp_path / "volume"
    [result] = warm_with(
        settings_for(tmp_path / "a", volume=volume), manifest("doubles"), told.append
    )
    assert [(s.kind, s.index, s.total) for s in told] == [
        ("restore", 0, 3),
        ("build", 0, 3),
        ("shape", 1, 3),
        ("shape", 2, 3),
        ("shape", 3, 3),
        ("done", 3, 3),
    ]
    assert told[0].what.startswith("miss: no artifacts of model m are stored")
    assert [dict(s.dims) for s in told[2:5]] == [{"batch": 1}, {"batch": 2}, {"batch": 3}]
    assert [s.elapsed for s in told] == sorted(s.elapsed for s in told)
    assert told[-1].what == "warm" and not told[-1].failed
    assert told[-1].elapsed == result.seconds
    # a second pod on the same volume: its restore hits
    again: list[ModelStep] = []
    warm_with(settings_for(tmp_path / "b", volume=volume), manifest("doubles"), again.append)
    assert again[0].kind == "restore" and again[0].what == "hit"
    assert [s.kind for s in again] == ["restore", "build", "shape", "shape", "shape", "done"]


def test_a_shape_says_whether_it_compiled_or_loaded_from_the_cache(tmp_path):
    told: list[ModelStep] = []
    warm_with(settings_for(tmp_path), manifest("misses_then_hits"), told.append)
    shapes = [s for s in told if s.kind == "shape"]
    assert [(s.compiles, s.cache_hits) for s in shapes] == [(1, 0), (0, 1), (0, 1)]
    assert [s.verb() for s in shapes] == ["compiled", "loaded from cache", "loaded from cache"]


def test_a_model_that_fails_at_a_shape_ends_failed_after_the_shapes_that_ran(tmp_path):
    told: list[ModelStep] = []
    [result] = warm_with(
        settings_for(tmp_path), manifest("fails_at_batch_3", "{batch: [1, 3, 4]}"), told.append
    )
    assert result.failed
    assert [(s.kind, s.index) for s in told[2:]] == [("shape", 1), ("done", 1)]
    assert told[-1].failed and "batch 3 is not supported" in told[-1].what
    assert told[-1].describe().startswith("model m: failed after 1/3 shapes in ")


def test_a_progress_that_raises_costs_no_model(tmp_path, caplog):
    calls: list[ModelStep] = []

    def broken(step: ModelStep) -> None:
        calls.append(step)
        raise BrokenPipeError("stderr is gone")

    with caplog.at_level(logging.WARNING, "warmup.compiled.warm"):
        [result] = warm_with(settings_for(tmp_path), manifest("doubles"), broken)
    assert not result.failed and len(result.shapes) == 3
    assert len(calls) == 1  # told once, then no more
    assert "model progress no longer shown: BrokenPipeError: stderr is gone" in caplog.text


def test_a_model_left_to_the_server_tells_its_restore_and_its_end(tmp_path):
    told: list[ModelStep] = []
    settings = settings_for(tmp_path, models_on_miss="server")
    warm_with(settings, manifest("doubles"), told.append)
    assert [(s.kind, s.total) for s in told] == [("restore", 3), ("done", 0)]
    assert told[-1].what == "deferred"
    assert told[-1].describe().startswith("model m: deferred in ")


@pytest.mark.parametrize(
    ("counter", "why"),
    [
        ("refused", "the remote tier's copy was refused: unsigned, or not signed by a trusted key"),
        ("errors", "the remote tier did not answer"),
        ("misses", "none on the remote tier either"),
    ],
)
def test_a_miss_says_why_the_remote_tier_did_not_fill_it(tmp_path, monkeypatch, counter, why):
    tier = type("Tier", (), {"stats": RemoteStats()})()

    def fetch(remote, root, **where):
        setattr(remote.stats, counter, getattr(remote.stats, counter) + 1)
        return False

    monkeypatch.setattr(warm.remote_models, "fetch", fetch)
    [model] = parse_manifest(manifest("doubles")).models
    key = warm.model_key(model)
    stored = warm._Artifacts(
        model, key, Services(settings_for(tmp_path), run=True), cpu_fingerprint(), tier
    )
    assert stored.restore() == {"restore": f"miss: no artifacts of model m are stored; {why}"}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def step(kind, **fields) -> ModelStep:
    return ModelStep("mlp", kind, fields.pop("elapsed", 9.8), total=4, **fields)


def test_on_a_terminal_a_bar_per_model_ends_with_its_line():
    screen = Terminal()
    show = model_progress_printer(screen)
    show(step("restore", seconds=0.02, what="hit"))
    show(step("shape", index=2, dims={"M": 64}, seconds=3.1, compiles=2))
    assert "\r[........................] model mlp: restore: hit (0.0 s)" in screen.getvalue()
    assert "\r[############............] model mlp 2/4 M=64 compiled 3.1 s, 9.8 s so far" in (
        screen.getvalue()
    )
    assert "\n" not in screen.getvalue()  # one line, redrawn
    show(step("done", index=4, what="warm", elapsed=12.0))
    last = screen.getvalue().split("\r")[-1]
    assert last.endswith("\n") and last.rstrip() == (
        "[########################] model mlp: warm after 4/4 shapes in 12.0 s"
    )


def test_elsewhere_each_step_is_a_log_line_but_the_end(caplog):
    show = model_progress_printer(io.StringIO())
    with caplog.at_level(logging.INFO, "warmup.compiled.progress"):
        show(step("restore", seconds=0.0, what="miss: no artifacts of model mlp are stored"))
        show(step("build", seconds=1.5, elapsed=1.6))
        show(step("shape", index=2, dims={"M": 64}, seconds=3.1, compiles=1))
        show(step("shape", index=3, dims={"M": 128}, seconds=0.4, cache_hits=1, elapsed=10.2))
        show(step("done", index=4, what="warm"))  # the runner logs the model's result
    assert caplog.messages == [
        "model mlp: restore: miss: no artifacts of model mlp are stored (0.0 s)",
        "model mlp: built in 1.5 s, 1.6 s so far",
        "model mlp: shape 2/4 (M=64) compiled in 3.1 s, 9.8 s so far",
        "model mlp: shape 3/4 (M=128) loaded from cache in 0.4 s, 10.2 s so far",
    ]


def test_a_miss_is_logged_once_by_the_progress_line(tmp_path, caplog):
    # the restore looks twice on a miss (before and under the fleet lock): neither look
    # logs it again beside the progress line
    with caplog.at_level(logging.INFO, "warmup"):
        warm_with(
            settings_for(tmp_path), manifest("doubles"), model_progress_printer(io.StringIO())
        )
    said = [r.getMessage() for r in caplog.records if "are stored" in r.getMessage()]
    assert len(said) == 1, said  # the time it took is the machine's: not compared
    assert re.fullmatch(
        r"model m: restore: miss: no artifacts of model m are stored \([0-9.]+ s\)", said[0]
    )
