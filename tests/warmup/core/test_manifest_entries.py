"""A manifest's entries, each checked field by field: kernels', models' and folders'."""

import json
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

import warmup.core.manifest_entries as entries_module
from registry.families import engine_key
from warmup.core.manifest_entries import CacheEntry, ManifestEntry, ModelEntry
from warmup.core.manifest_shapes import MAX_SHAPES


def kernel_entry(**changes: object) -> dict:
    base = {
        "kernel": "ag_gemm",
        "dtype": "bf16",
        "world_size": 2,
        "shapes": [{"M": 64, "N": 64, "K": 64}],
    }
    return {**base, **changes}


def model_entry(**changes: object) -> dict:
    base = {"name": "m", "build": "pkg.mod:build", "inputs": [{"shape": ["b", 8], "dtype": "fp32"}]}
    return {"dims": {"b": [1, 2]}, **base, **changes}


def messages(model: type, data: dict, context: dict | None = None) -> list[str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data, context=context)
    return [str(e["msg"]) for e in info.value.errors()]


def test_a_kernel_entry_expands_its_shapes_once_each_in_order():
    entry = ManifestEntry.model_validate(
        kernel_entry(shapes=[{"M": [64, 128], "N": 64, "K": 64}, {"M": 64, "N": 64, "K": 64}])
    )
    assert entry.expand() == [{"M": 64, "N": 64, "K": 64}, {"M": 128, "N": 64, "K": 64}]
    assert not entry.is_user_function
    assert ManifestEntry.model_validate(kernel_entry(kernel="pkg.mod:warm")).is_user_function


def test_an_unknown_kernel_is_said_beside_the_entrys_other_errors():
    found = messages(ManifestEntry, kernel_entry(kernel="rm -rf /", dtype="int8"))
    assert len(found) == 2
    assert "neither one of 'ag_gemm', 'matmul' nor 'module:function'" in found[0]
    assert "Input should be 'bf16', 'fp16' or 'fp32'" in found[1]
    [alone] = messages(ManifestEntry, kernel_entry(kernel="nope"))
    assert "kernel 'nope' is neither" in alone


def test_the_kernels_rule_lists_its_reasons_up_to_a_number():
    shapes = [{"M": list(range(1, 20, 2)), "N": 64, "K": 64}]  # 10 odd M at world size 2
    [found] = messages(ManifestEntry, kernel_entry(shapes=shapes))
    assert found.startswith("Value error, ag_gemm rejects 10 shape(s): M=1 is not a multiple")
    assert found.endswith(f"; and {10 - entries_module.MAX_REASONS} more")


def test_the_kernels_rules_look_at_no_more_shapes_than_the_manifest_may_hold(monkeypatch):
    checked = []
    monkeypatch.setattr(
        entries_module, "check_shape", lambda kernel, shape, world_size: checked.append(1)
    )
    shapes = [{"M": {"start": 2, "stop": 8194, "step": 2}, "N": 8, "K": 8}]  # 4096 shapes
    context = entries_module.validation_context(find_functions=False, notes=None)
    ManifestEntry.model_validate(kernel_entry(shapes=shapes), context=context)
    ManifestEntry.model_validate(kernel_entry(shapes=shapes), context=context)
    assert len(checked) == MAX_SHAPES  # the second entry's would pass the manifest's limit


def test_functions_are_found_only_when_the_context_asks(tmp_path, monkeypatch):
    (tmp_path / "found_mod.py").write_text("raise RuntimeError('never run')\ndef warm(): pass\n")
    (tmp_path / "late_bound.py").write_text("globals()['warm'] = print\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    narrow = kernel_entry(kernel="found_mod:warm", world_size=1)
    assert ManifestEntry.model_validate(narrow).kernel == "found_mod:warm"
    notes: list[str] = []
    context = entries_module.validation_context(find_functions=True, notes=notes)
    [found] = messages(ManifestEntry, narrow, context)
    assert "a warmup calls it as warm(shape=..., dtype=..., device=...)" in found
    ManifestEntry.model_validate({**narrow, "kernel": "late_bound:warm"}, context=context)
    assert len(notes) == 1 and notes[0].startswith("late_bound:warm not checked without")


def test_a_model_entry_expands_every_combination_of_its_dims():
    model = ModelEntry.model_validate(
        model_entry(
            dims={"b": [1, 2], "s": {"pow2": [8, 16]}},
            inputs=[{"shape": ["b", "s"], "dtype": "int64", "high": 100}],
        )
    )
    assert model.count() == 4
    assert model.expand() == [
        {"b": 1, "s": 8},
        {"b": 1, "s": 16},
        {"b": 2, "s": 8},
        {"b": 2, "s": 16},
    ]


@pytest.mark.parametrize(
    "changes,expected",
    [
        ({"name": "Upper"}, "name 'Upper' must be 1-63 of a-z 0-9 _ . -"),
        ({"build": "no_colon"}, "build 'no_colon' is not 'package.module:function'"),
        ({"dims": {"b": 1, "9x": 2}}, "dimension name '9x' is not an identifier"),
        ({"dims": {}}, "inputs use dimension(s) ['b'] that dims does not declare"),
        ({"dims": {"b": 1, "unused": 2}}, "dims ['unused'] are used by no input"),
        ({"dims": {"b": 0}}, "b=0 must be >= 1"),
    ],
)
def test_a_bad_model_entry_says_which_field_and_why(changes, expected):
    assert any(expected in m for m in messages(ModelEntry, model_entry(**changes)))


def test_model_names_are_lower_case_path_components():
    assert entries_module.MODEL_NAME.match("llama-70b.blocks_4")
    assert not entries_module.MODEL_NAME.match(".hidden")


def test_a_declared_folder_is_absolute_and_not_the_root():
    cache = CacheEntry(name="vllm", path=Path("/root/.cache/vllm"), key="v1")
    assert cache.path == Path("/root/.cache/vllm")
    assert any(
        "must be an absolute folder" in m
        for m in messages(CacheEntry, {"name": "vllm", "path": "relative/dir", "key": "v1"})
    )
    assert any(
        "must be an absolute folder" in m
        for m in messages(CacheEntry, {"name": "vllm", "path": "/", "key": "v1"})
    )
    assert any(
        "name 'Bad Name'" in m
        for m in messages(CacheEntry, {"name": "Bad Name", "path": "/x", "key": "v1"})
    )


def cache_entry(**changes: object) -> dict:
    return {"name": "vllm", "path": "/var/cache/engine/vllm", "key": "qwen3-8b tp2", **changes}


def test_a_declared_folder_names_what_its_engine_keys_on():
    cache = CacheEntry.model_validate(
        cache_entry(engine="vllm", key_env=["VLLM_*", "MY_KNOB"], key_paths=["/models/qwen3-8b"])
    )
    assert (cache.engine, cache.key_env) == ("vllm", ["VLLM_*", "MY_KNOB"])
    assert cache.key_paths == [Path("/models/qwen3-8b")]
    plain = CacheEntry.model_validate(cache_entry())
    assert (plain.engine, plain.key_env, plain.key_paths) == (None, [], [])


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"engine": "tgi"}, "Input should be 'vllm', 'sglang', 'deepgemm' or 'flashinfer'"),
        ({"key_env": [""]}, "key_env '' is not a variable name or pattern"),
        ({"key_env": ["VLLM X"]}, "key_env 'VLLM X' is not a variable name or pattern"),
        ({"key_env": ["V" * 129]}, "is not a variable name or pattern: 1-128 of A-Z"),
        ({"key_env": ["*"]}, "key_env '*' names no variable (it would match every one)"),
        ({"key_env": ["A"] * 33}, "List should have at most 32 items"),
        ({"key_paths": ["models/qwen"]}, "key_paths 'models/qwen' must be an absolute path"),
        ({"key_paths": ["/" + "m" * 1024]}, "must be an absolute path of at most 1024"),
        ({"key_paths": ["/m"] * 17}, "List should have at most 16 items"),
    ],
)
def test_a_bad_engine_key_is_refused_saying_why(changes, expected):
    assert any(expected in m for m in messages(CacheEntry, cache_entry(**changes)))


def test_the_manifests_engines_and_bounds_are_the_registrys():
    assert set(get_args(entries_module.Engine)) == set(engine_key.ENGINES)
    assert entries_module.MAX_KEY_PATHS == engine_key.MAX_KEY_PATHS
    assert entries_module.MAX_KEY_PATH == engine_key.MAX_PATH
    assert entries_module.MAX_KEY_ENV_PATTERN == engine_key.MAX_PATTERN


def test_declared_folders_must_not_overlap():
    outer = CacheEntry(name="outer", path=Path("/data/cache"), key="k")
    inner = CacheEntry(name="inner", path=Path("/data/cache/inductor"), key="k")
    apart = CacheEntry(name="apart", path=Path("/data/other"), key="k")
    entries_module.no_nested_paths([outer, apart])
    with pytest.raises(ValueError, match="inner's path '/data/cache/inductor' is inside outer's"):
        entries_module.no_nested_paths([outer, inner])


def test_resolving_imports_and_checks_the_call_a_run_makes():
    spec = "tests.warmup.user_functions"
    assert entries_module.resolve_user_function(f"{spec}:raise_error").__name__ == "raise_error"
    with pytest.raises(ValueError, match="takes_positional_only"):
        entries_module.resolve_user_function(f"{spec}:takes_positional_only")
    with pytest.raises(ValueError, match=r"a warmup calls it as raise_error\(device=...\)"):
        entries_module.resolve_model_builder(f"{spec}:raise_error")


def test_the_validation_context_starts_with_the_manifests_shape_budget():
    notes = ["kept"]
    context = entries_module.validation_context(find_functions=True, notes=notes)
    assert context["notes"] is notes and context["shapes_left"] == MAX_SHAPES
    assert entries_module.validation_context(find_functions=False, notes=None)["notes"] == []
    assert json.dumps(context)  # plain data
