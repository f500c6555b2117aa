"""bench/compiled_model.py's judging and its manifests: the GPU run is the bench itself."""

from __future__ import annotations

import pytest

from bench.compiled_model import manifest_text, table, verdicts
from warmup.core.manifest import parse_manifest


def row(case: str, first: float, extra: float = 0.0, **counts: int) -> dict:
    phases = {"import": 1.0, "first_calls": first}
    if case == "sidecar":
        phases["restore"] = extra
    if case == "megacache":
        phases["load"] = extra
    zero = {k: 0 for k in ("inductor_compiles", "fxgraph_misses", "kernel_compiles")}
    return {
        "model": "m",
        "case": case,
        "phases": phases,
        "steady_ms": {"a": 1.0},
        "counts": {**zero, "autotune_runs": 0, **counts},
    }


@pytest.mark.parametrize("name", ["blocks4", "blocks4_max_autotune", "small_mlp"])
def test_the_bench_manifests_are_valid(name):
    seq = None if name == "small_mlp" else 128
    from bench.compiled_model import MODELS

    [model] = parse_manifest(manifest_text(name, MODELS[name], [1, 4], seq, "fp16")).models
    assert model.count() == 2


def test_targets_are_judged_from_restore_plus_first_calls():
    rows = [row("same_host", 3.0), row("sidecar", 3.0, 0.3), row("megacache", 5.0, 6.0)]
    lines = verdicts(rows)
    assert "m: sidecar / same_host = 1.10 (target <= 1.1)" in lines
    assert "m: sidecar / megacache = 0.30 (target <= 0.6)" in lines
    assert any("(met: all 0)" in line for line in lines)


def test_a_compile_in_the_sidecars_server_misses_the_target():
    lines = verdicts([row("sidecar", 3.0, 0.3, fxgraph_misses=1)])
    assert any("MISSED" in line for line in lines)


def test_a_missing_sidecar_case_is_not_measured_never_met():
    assert verdicts([row("same_host", 3.0)]) == ["m: sidecar case missing: not measured"]


def test_the_table_has_a_row_per_server_case():
    lines = table([{"case": "producer", "model": "m"}, row("sidecar", 3.0, 0.3)])
    assert len(lines) == 3 and "| m | sidecar | 1.00 | 0.30 | 3.00 | 3.30 |" in lines[2]


def test_a_model_served_through_kernels_declares_their_shapes_too():
    from bench.compiled_model import MODELS

    manifest = parse_manifest(manifest_text("ag_mlp", MODELS["ag_mlp"], [1, 4], 128, "fp16"))
    assert [(e.kernel, e.expand()[0]["N"]) for e in manifest.entries] == [
        ("ag_gemm", 8192),
        ("ag_gemm", 2048),
    ]
    assert manifest.entries[0].expand()[1]["M"] == 512  # batch 4 x seq 128 tokens


def test_the_models_dtype_is_the_one_their_manifests_declare_fp32_on_the_cpu():
    import torch

    from bench.compiled_model import MODELS, model_dtype
    from bench.compiled_models import ag_dtype

    assert ag_dtype("cpu") == ("fp32", torch.float32)
    assert ag_dtype("cuda:1") == ("fp16", torch.float16)
    for device in ("cpu", "cuda"):
        text = manifest_text("ag_mlp", MODELS["ag_mlp"], [1], 8, model_dtype(device), world=2)
        manifest = parse_manifest(text)
        declared = {e.dtype for e in manifest.entries} | {
            i.dtype for i in manifest.models[0].inputs
        }
        assert declared == {ag_dtype(device)[0]}
