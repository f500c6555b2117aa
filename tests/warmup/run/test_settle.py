"""Settle passes: models that tuned at run time run again in fresh rank processes until
a pass compiles nothing; each pass's counts land in every rank's result."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import settings_for, write_manifest
from tests.warmup.compiled.models import manifest
from warmup.core.manifest import load_manifest, parse_manifest
from warmup.core.results import ModelResult, RankReport
from warmup.run.launch import run
from warmup.run.settle import settle

MANIFEST = parse_manifest(
    manifest(("tuned", "mlp", "{batch: 1, seq: 3}"), ("plain", "mlp", "{batch: 2, seq: 3}"))
)


def result(name: str, rank: int, **counts: int) -> ModelResult:
    return ModelResult(name=name, rank=rank, phase="warm", counts=counts)


def first_pass(run_dir: Path, world: int = 2) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        models = [
            result("tuned", rank, autotune_runs=9, kernel_compiles=40),
            result("plain", rank, inductor_compiles=1),
        ]
        RankReport(rank=rank, world=world, models=models, written=123.0).write(
            run_dir, restamp=False
        )


class Passes:
    """A stand-in for fresh rank processes: each pass compiles what ``compiles`` says
    and, unless ``caching`` is off, caches one file per kernel compiled."""

    def __init__(self, *compiles: int | Exception, world: int = 2, cache: Path | None = None):
        self.compiles, self.world, self.asked, self.cache = list(compiles), world, [], cache

    def __call__(self, manifest, run_dir):
        self.asked.append(([m.name for m in manifest.models], manifest.entries, run_dir.name))
        step = self.compiles.pop(0)
        if isinstance(step, Exception):
            raise step
        for kernel in range(step if self.cache else 0):
            self.cache.mkdir(parents=True, exist_ok=True)
            (self.cache / run_dir.name).mkdir(exist_ok=True)
            (self.cache / run_dir.name / f"{kernel}.cubin").write_bytes(b"x")
        return [
            RankReport(rank=r, world=self.world, models=[result("tuned", r, kernel_compiles=step)])
            for r in range(self.world)
        ]


def test_a_model_that_tuned_at_run_time_runs_again_until_a_pass_compiles_nothing(tmp_path):
    first_pass(tmp_path)
    settings = settings_for(tmp_path)
    passes = Passes(6, 0, 99, cache=settings.folders.triton_cache_dir)
    assert settle(settings, MANIFEST, tmp_path, passes) > 0
    assert passes.asked == [(["tuned"], [], "settle-1"), (["tuned"], [], "settle-2")]
    for report in RankReport.read_all(tmp_path):
        tuned, plain = report.models
        assert [p["kernel_compiles"] for p in tuned.settle] == [6, 0] and tuned.settled
        assert [p["new_files"] for p in tuned.settle] == [6, 0]
        assert plain.settle == [] and not plain.settled  # it never tuned at run time
        assert report.written == 123.0  # the rank's own time, kept


def test_passes_stop_at_the_limit_and_say_the_model_still_compiles(tmp_path):
    first_pass(tmp_path)
    settings = settings_for(tmp_path, model_settle_passes=3)
    settle(
        settings,
        MANIFEST,
        tmp_path,
        Passes(5, 4, 3, 2, cache=settings.folders.triton_cache_dir),
    )
    tuned = RankReport.read_all(tmp_path)[0].models[0]
    assert len(tuned.settle) == 3 and not tuned.settled
    assert "3 settle passes, still compiling" in tuned.describe()


def test_a_pass_that_caches_nothing_new_is_the_last(tmp_path, caplog):
    """Kernels compiled in every process and never cached: another pass would only repeat."""
    first_pass(tmp_path)
    passes = Passes(3, 3, 3)  # compiles, caches nothing
    settle(settings_for(tmp_path), MANIFEST, tmp_path, passes)
    tuned = RankReport.read_all(tmp_path)[0].models[0]
    assert len(passes.asked) == 1 and not tuned.settled
    assert tuned.settle[0]["new_files"] == 0 and "cached nothing new" in caplog.text


def test_a_failed_pass_is_recorded_and_costs_the_model_nothing(tmp_path):
    first_pass(tmp_path)
    settle(settings_for(tmp_path), MANIFEST, tmp_path, Passes(RuntimeError("rank 1 exited")))
    tuned = RankReport.read_all(tmp_path)[1].models[0]
    assert tuned.settle == [{"error": "no result", "new_files": 0}]
    assert not tuned.failed and not tuned.settled


def test_no_passes_when_turned_off(tmp_path):
    first_pass(tmp_path)
    passes = Passes()
    assert settle(settings_for(tmp_path, model_settle_passes=0), MANIFEST, tmp_path, passes) == 0
    assert passes.asked == []


def test_a_pass_past_the_runs_time_limit_is_not_started(tmp_path):
    from warmup.run.launch import RunError, _settle_pass

    with pytest.raises(RunError, match="no time is left"):
        _settle_pass(settings_for(tmp_path), 1, time.time() - 1, MANIFEST, tmp_path / "settle-1")
    assert not (tmp_path / "settle-1").exists()


@pytest.mark.slow
def test_the_launcher_settles_a_model_in_fresh_rank_processes(tmp_path):
    text = manifest(("tuned", "tunes_at_first_call", "{batch: [1, 2], seq: 3}"))
    path = write_manifest(tmp_path / "manifest.yaml", text)
    status = run(settings_for(tmp_path, manifest=path), load_manifest(path))
    assert status.ready, status.failures
    [model] = status.models
    assert model.counts["autotune_runs"] == 1 and model.counts["inductor_compiles"] == 2
    [again] = model.settle  # a fresh process: restored, nothing compiled, one "tuning"
    assert (again["inductor_compiles"], again["kernel_compiles"], again["autotune_runs"]) == (
        0,
        0,
        1,
    )
    assert again["fxgraph_hits"] == 2 and model.settled
    assert status.phases["settle"] > 0
