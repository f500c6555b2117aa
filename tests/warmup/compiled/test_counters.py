"""What a compiled model cost, counted: Triton's own compiles heard through its
compilation listener (a disk-cache hit is not one), and the environment that keeps a
pod's compile caches where the warmup restores them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, env_without_interpreter, settings_for
from warmup.compiled.counters import CompileCounts, snapshot
from warmup.compiled.environment import inductor_environment


@pytest.mark.slow
def test_a_triton_compile_counts_and_a_disk_cache_hit_does_not(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tests.warmup.compiled._count_triton"],
        cwd=ROOT,
        env=env_without_interpreter(TRITON_CACHE_DIR=str(tmp_path / "triton")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1, 0]


def test_request_costs_name_only_what_happened():
    counts = CompileCounts(dynamo_frames=2, fxgraph_hits=2, kernel_compiles=1)
    assert counts.request_costs() == {"dynamo_frames": 2, "kernel_compiles": 1}
    assert (counts - counts).request_costs() == {}


def test_each_inductor_benchmark_that_ran_is_an_autotune_run_and_a_request_cost():
    from torch._dynamo.utils import compilation_time_metrics, counters

    before = snapshot()
    ran = {
        "CachingAutotuner.coordinate_descent_tuning": 2,
        "mm_template_autotuning": 1,  # "{name}_template_autotuning": a GEMM's choice
        "CachingAutotuner.combo_sequential_autotune": 1,
        "CachingAutotuner.benchmark_all_configs": 1,
    }
    for name, times in ran.items():
        compilation_time_metrics.setdefault(name, []).extend([0.1] * times)
    # an FX-graph cache hit replays the counters its entry recorded: nothing ran
    counters["inductor"]["coordesc_tuning_bench"] += 7
    counters["inductor"]["select_algorithm_autotune"] += 6
    try:
        counts = snapshot() - before
    finally:
        for name, times in ran.items():
            del compilation_time_metrics[name][-times:]
    assert (counts.coordesc_benchmarks, counts.gemm_autotunes, counts.config_benchmarks) == (
        2,
        1,
        1,
    )
    assert counts.request_costs() == {"autotune_runs": 5}


def test_the_cuda_jit_cache_lives_in_the_inductor_cache(tmp_path):
    env = inductor_environment(settings_for(tmp_path))
    folder = (tmp_path / "work" / "inductor-cache").resolve()
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert env["CUDA_CACHE_PATH"] == str(folder / "cuda-jit")  # saved and restored with it
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"


def test_a_models_key_changes_with_what_its_artifacts_depend_on_and_not_with_paths(tmp_path):
    from warmup.compiled.key import model_key
    from warmup.core.manifest import parse_manifest

    text = (
        "version: 1\nmodels:\n  - name: m\n    build: tests.warmup.compiled.models:mlp\n"
        "    dims: {batch: [1, 2]}\n    inputs: [{shape: [batch, 32], dtype: fp32}]\n"
    )
    base = model_key(parse_manifest(text).models[0])
    changed = [
        text.replace("[1, 2]", "[1, 3]"),
        text.replace("fp32", "bf16"),
        text.replace("models:mlp", "models:raises"),
        text.replace("    dims", "    mode: inference_mode\n    dims"),
        text.replace("    dims", "    world_size: 2\n    dims"),
    ]
    digests = {model_key(parse_manifest(t).models[0]).digest for t in changed}
    assert base.digest not in digests and len(digests) == len(changed)
    assert model_key(parse_manifest(text.replace("name: m", "name: n")).models[0]) == base
    assert str(tmp_path) not in str(base.parts) and "/" not in base.parts["module_sha"]


def test_a_models_key_runs_none_of_its_packages_code(tmp_path, monkeypatch):
    """The init container keys models without importing torch: a package's ``__init__``
    (which may import it) is not run to find the build function's module."""
    from warmup.compiled.key import model_key
    from warmup.core.manifest import parse_manifest

    package = tmp_path / "keyed_pkg_x"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('the package ran')\n")
    (package / "model.py").write_text("def build(device):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (
        "version: 1\nmodels:\n  - name: m\n    build: keyed_pkg_x.model:build\n"
        "    dims: {batch: [1]}\n    inputs: [{shape: [batch, 4], dtype: fp32}]\n"
    )
    key = model_key(parse_manifest(text).models[0])
    assert key.parts["build"] == "keyed_pkg_x.model:build" and "keyed_pkg_x" not in sys.modules
