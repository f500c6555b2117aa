import itertools
import json
import sys

import pytest

from kernels.shapes import RULES, check_shape
from warmup.core.manifest import (
    MAX_SHAPES,
    ManifestError,
    load_manifest,
    parse_manifest,
)

GOOD = """
version: 1
entries:
  - kernel: ag_gemm
    dtype: bf16
    world_size: 2
    shapes:
      - {M: 4096, N: 6656, K: 16384}
      - {M: {pow2: [2, 16]}, N: 4096, K: 4096}
      - {M: [64, 128], N: {start: 1024, stop: 3073, step: 1024}, K: 512}
  - kernel: my_pkg.kernels:warm_norm
    dtype: fp16
    world_size: 1
    policy: fallback
    shapes: [{M: 8, N: 8, K: 1}]
"""


def test_expands_lists_and_ranges_and_digests_stably():
    manifest = parse_manifest(GOOD)
    shapes = manifest.entries[0].expand()
    assert shapes[0] == {"M": 4096, "N": 6656, "K": 16384}
    assert [s["M"] for s in shapes[1:5]] == [2, 4, 8, 16]
    assert len(shapes) == 1 + 4 + 2 * 3
    assert manifest.entries[1].policy == "fallback" and manifest.entries[0].policy == "tune"
    assert manifest.digest() == parse_manifest(GOOD).digest()
    assert manifest.world_sizes() == {1, 2}


def test_json_manifests_read_too(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "entries": [
                    {
                        "kernel": "ag_gemm",
                        "dtype": "fp32",
                        "world_size": 1,
                        "shapes": [{"M": 8, "N": 8, "K": 8}],
                    }
                ],
            }
        )
    )
    assert load_manifest(path).entries[0].dtype == "fp32"


def entry(**changes):
    base = {
        "kernel": "ag_gemm",
        "dtype": "bf16",
        "world_size": 2,
        "shapes": [{"M": 64, "N": 64, "K": 64}],
    }
    return json.dumps({"version": 1, "entries": [{**base, **changes}]})


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", "(top): Input should be a valid dictionary"),
        (
            "version: 1\nentries: []",
            "the manifest declares nothing to warm: add entries, models or caches",
        ),
        ('{"version": 2, "entries": []}', "version: Input should be 1"),
        ('{"version": 1, "entries": [], "extra": 3}', "extra: Extra inputs are not permitted"),
        ("version: [1\n", "not YAML or JSON"),
        (entry(dtype="int8"), "entries.0.dtype: Input should be 'bf16', 'fp16' or 'fp32'"),
        (entry(world_size=0), "entries.0.world_size: Input should be greater than or equal to 1"),
        (entry(world_size=16), "entries.0.world_size: Input should be less than or equal to 8"),
        (
            entry(policy="sometimes"),
            "entries.0.policy: Input should be 'tune', 'fallback' or 'fail'",
        ),
        (entry(kernel="rm -rf /"), "neither one of 'ag_gemm', 'matmul' nor 'module:function'"),
        (entry(shapes=[]), "entries.0.shapes: List should have at least 1 item"),
        (entry(shapes=[{"M": 64, "N": 64}]), "entries.0.shapes.0.K: Field required"),
        (entry(shapes=[{"M": 64, "N": 64, "K": 64, "Q": 1}]), "entries.0.shapes.0.Q: Extra inputs"),
        (entry(shapes=[{"M": 64, "N": 0, "K": 64}]), "N=0 must be >= 1"),
        (
            entry(shapes=[{"M": 64, "N": "wide", "K": 64}]),
            "entries.0.shapes.0.N: must be an int, a list of ints",
        ),
        (
            entry(shapes=[{"M": {"pow2": [3, 8]}, "N": 64, "K": 64}]),
            "entries.0.shapes.0.M: pow2 bounds [3, 8] must be powers of two",
        ),
        (
            entry(shapes=[{"M": {"pow2": [2, 4096]}, "N": list(range(1, 600)), "K": 64}]),
            "the limit is 4096",
        ),
        (entry(unknown=True), "entries.0.unknown: Extra inputs are not permitted"),
    ],
)
def test_bad_manifests_name_the_field_and_value(text, expected):
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, source="m.yaml")
    assert expected in str(info.value), str(info.value)


def test_every_error_is_listed_at_once():
    text = json.dumps(
        {
            "version": 3,
            "entries": [
                {
                    "kernel": "ag_gemm",
                    "dtype": "int4",
                    "world_size": 99,
                    "shapes": [{"M": 1, "N": 1, "K": 1}],
                }
            ],
        }
    )
    with pytest.raises(ManifestError) as info:
        parse_manifest(text)
    assert len(info.value.errors) == 3
    assert all("(got " in line for line in info.value.errors)


def test_a_missing_file_is_a_manifest_error(tmp_path):
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "nope.yaml")


def test_each_kernels_rule_on_its_shapes_is_checked_as_the_manifest_is_read():
    with pytest.raises(ManifestError) as info:
        parse_manifest(entry(policy="often", shapes=[{"M": [63, 64, 65], "N": 64, "K": 64}]))
    assert info.value.errors[0].startswith("entries.0.policy: ")
    assert info.value.errors[1].startswith(
        "entries.0.shapes: ag_gemm rejects 2 shape(s): M=63 is not a multiple of world_size 2; "
        "M=65 is not a multiple of world_size 2 (got "
    )
    matmul = entry(kernel="matmul", shapes=[{"M": 63, "N": 64, "K": 64}])
    assert parse_manifest(matmul).entries[0].kernel == "matmul"


def test_the_rules_read_without_torch_say_what_the_adapters_say():
    import kernels  # the adapters import torch and triton; kernels.shapes does not

    assert set(RULES) == set(kernels.ADAPTERS)
    for name in RULES:
        adapter = kernels.adapter_for(name)
        for world, m in itertools.product((1, 2, 3, 8), (1, 2, 3, 8, 63, 64, 4096, 4097)):
            shape = {"M": m, "N": 64, "K": 32}
            assert check_shape(name, shape, world_size=world) == adapter.check_shape(
                shape, world_size=world
            ), (name, world, m)


def test_the_kernels_rules_look_at_no_more_shapes_than_the_manifest_may_hold(monkeypatch):
    import warmup.core.manifest_entries

    checked = []
    monkeypatch.setattr(
        warmup.core.manifest_entries,
        "check_shape",
        lambda kernel, shape, world_size: checked.append(1),
    )
    lines = [{"M": {"start": 2, "stop": 8194, "step": 2}, "N": 8, "K": 8}]  # 4096 shapes
    text = json.dumps(
        {"version": 1, "entries": [json.loads(entry(shapes=lines))["entries"][0]] * 1000}
    )
    with pytest.raises(ManifestError, match="the limit is 4096"):
        parse_manifest(text)
    assert len(checked) == MAX_SHAPES  # the first entry's; the others are over the limit


def test_a_yaml_error_names_the_file_line_and_column_with_a_caret(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("version: 1\nentries:\n  - kernel: ag_gemm: x\n")
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    message = str(e.value)
    # the rest of the sentence is the parser's: "here" (PyYAML), "in this context" (libyaml)
    assert f"{path}:3:20: mapping values are not allowed" in message
    assert "\n        - kernel: ag_gemm: x\n" in message
    assert message.endswith("\n" + " " * (6 + 19) + "^")  # under column 20


def test_the_functions_it_names_are_found_without_running_them_when_asked(tmp_path, monkeypatch):
    (tmp_path / "user_mod.py").write_text(
        "raise RuntimeError('never run')\ndef warm(shape, dtype): pass\ndef narrow(): pass\n"
    )
    (tmp_path / "late_mod.py").write_text("import sys\nsetattr(sys.modules[__name__], 'w', 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel = json.loads(entry(kernel="user_mod:warm", world_size=1))["entries"][0]
    late = {**kernel, "kernel": "late_mod:warm"}
    model = {"name": "m", "build": "user_mod:narrow", "inputs": [{"shape": [2], "dtype": "fp32"}]}
    text = json.dumps({"version": 1, "entries": [kernel, late], "models": [model]})
    assert parse_manifest(text).entries[0].kernel == "user_mod:warm"  # not looked for
    notes: list[str] = []
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, find_functions=True, notes=notes)
    kernel_error, model_error = info.value.errors
    assert kernel_error.startswith("entries.0.kernel: a warmup calls it as warm(shape=..., ")
    assert "got an unexpected keyword argument 'device'" in kernel_error
    assert model_error.startswith("models.0.build: a warmup calls it as narrow(device=...)")
    assert len(notes) == 1 and notes[0].startswith("late_mod:warm not checked without importing")
    assert "user_mod" not in sys.modules and "late_mod" not in sys.modules
