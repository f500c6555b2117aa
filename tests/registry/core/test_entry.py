import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import Entry, KernelConfig, Measurement, RegistryError, canonical_key
from registry.core.entry import SCHEMA_VERSION, shape_slug

_OLD_FINGERPRINT = {
    "hardware": {
        "gpu_name": "NVIDIA H200",
        "compute_capability": "9.0",
        "sm_count": 132,
        "gpus_per_node": 8,
        "nvlink_full_mesh": True,
        "memory_gib": 141,
    },
    "software": {
        "torch": "2.11.0",
        "triton": "3.6.0",
        "triton_hash": "t" * 16,
        "cuda_runtime": "12.8",
        "driver": "570.86",
        "ptxas": "12.8",
    },
    "kernel_hash": "k" * 64,
}


def test_canonical_key_ignores_order_and_rejects_non_json():
    assert canonical_key({"b": 1, "a": [2, 3]}) == canonical_key({"a": [2, 3], "b": 1})
    for bad in ({"x": object()}, {"x": float("nan")}, {1: 2}, [("M", 1)]):
        with pytest.raises(RegistryError):
            canonical_key(bad)


def test_entry_round_trips_every_field(make_entry):
    entry = make_entry()
    data = json.loads(json.dumps(entry.to_json()))
    assert data["schema"] == 1  # no config names an algorithm: the oldest schema holds it
    assert set(data) >= {
        "kernel",
        "key",
        "fingerprint",
        "best",
        "measurements",
        "tuning_seconds",
        "created",
        "host",
        "source",
    }
    assert data["best"]["kwargs"] == {"BLOCK_M": 128, "BLOCK_N": 128}
    assert Entry.from_json(data) == entry


def test_entry_path_shows_kernel_gpu_software_shape(make_entry):
    parts = make_entry(m=4096).relpath().parts
    assert parts[0] == "ag_gemm"
    assert parts[1].startswith("NVIDIA-H200_sm90_132sm_x8-nvl")
    assert parts[2].startswith("torch2.11.0_triton3.6.0_cuda12.8_")
    assert parts[3].startswith("K16384_M4096_N6656_dtype-bf16_world-2-")


def test_the_winning_algorithm_round_trips_in_schema_2(make_entry):
    baseline = KernelConfig.make(algorithm="nccl_cublas")
    fused = KernelConfig.make({"BLOCK_M": 128}, algorithm="fused_pull", num_warps=8)
    entry = replace(
        make_entry(),
        best=baseline,
        measurements=(Measurement(baseline, 0.08), Measurement(fused, 0.16)),
    )
    data = json.loads(json.dumps(entry.to_json()))
    assert data["schema"] == SCHEMA_VERSION == 2
    assert data["best"]["algorithm"] == "nccl_cublas"
    assert data["measurements"][1]["config"]["algorithm"] == "fused_pull"
    read = Entry.from_json(data)
    assert read == entry and read.best.algorithm == "nccl_cublas"
    assert read.best != KernelConfig.make()  # the algorithm is part of the config's identity


def test_an_entry_written_before_algorithms_still_reads():
    """A schema-1 file as the previous version wrote it, byte for byte in its fields."""
    old = {
        "schema": 1,
        "kernel": "ag_gemm",
        "key": {"K": 4096, "M": 256, "N": 4096, "dtype": "bf16", "world": 2},
        "fingerprint": _OLD_FINGERPRINT,
        "best": {
            "kwargs": {"BLOCK_K": 64, "BLOCK_M": 64, "BLOCK_N": 128, "GROUP_M": 8},
            "num_warps": 4,
            "num_stages": 4,
            "num_ctas": 1,
            "maxnreg": None,
        },
        "measurements": [],
        "tuning_seconds": 2.5,
        "created": "2026-11-20T10:00:00+00:00",
        "host": "node-1",
        "source": "tuned",
    }
    entry = Entry.from_json(old)
    assert entry.best.algorithm is None and entry.best.meta["BLOCK_M"] == 64
    assert entry.to_json() == old  # and is written back as it was


def test_a_schema_1_entry_naming_an_algorithm_is_refused(make_entry):
    """No version wrote one: read as it stands it would be written back as schema 2."""
    data = json.loads(json.dumps(make_entry().to_json()))
    data["best"]["algorithm"] = "nccl_cublas"
    with pytest.raises(RegistryError, match="schema 1 but names an algorithm"):
        Entry.from_json(data)
    Entry.from_json({**data, "schema": 2})  # the same in schema 2 reads


@pytest.mark.parametrize("bad", ["", "Fused", "x" * 65, 5, ["a"], "a b"])
def test_a_bad_algorithm_name_is_a_registry_error(bad):
    with pytest.raises(RegistryError, match="'algorithm' has value"):
        KernelConfig.from_json({"kwargs": {}, "algorithm": bad})


def test_a_config_label_names_its_algorithm():
    assert KernelConfig.make(algorithm="nccl_cublas").label() == "nccl_cublas"
    fused = KernelConfig.make({"BLOCK_M": 64}, algorithm="fused_pull", num_warps=4)
    assert fused.label() == "fused_pull BLOCK_M=64 w4 s3"
    assert KernelConfig.make({"BLOCK_M": 64}).label() == "BLOCK_M=64 w4 s3"


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("schema", 99, "schema"),
        ("schema", 0, "schema"),
        ("tuning_seconds", -1, "tuning_seconds"),
        ("kernel", "../etc", "Kernel name"),
        ("fingerprint", {"hardware": {}}, "Fingerprint"),
        # wrong-typed values that once escaped as TypeError/AttributeError and bricked the store
        ("measurements", [1], "Measurement 1 is not an object"),
        ("measurements", 5, "'measurements' has value 5; not a list"),
        ("measurements", [{"config": [], "median_ms": 1}], "Config"),
        ("best", [1, 2], "Config"),
        ("best", {"kwargs": [1]}, "Config"),
        ("key", [1], "Key"),
        ("key", {"M": [{"deep": float("inf")}]}, "finite"),
        ("kernel", 7, "Kernel name 7"),
        ("fingerprint", [], "Fingerprint is list"),
        ("tuning_seconds", True, "tuning_seconds"),
        ("tuning_seconds", "1", "tuning_seconds"),
        ("created", ["x"], "'created' has value"),
        ("schema", True, "schema"),
        ("schema", "1", "schema"),
    ],
)
def test_entry_rejects_bad_fields(make_entry, field, value, message):
    data = make_entry().to_json()
    data[field] = value
    with pytest.raises(RegistryError, match=message):
        Entry.from_json(data)


def test_entry_refuses_a_deep_nest_with_a_registry_error(make_entry):
    data = make_entry().to_json()
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    data["key"] = {"M": deep}
    with pytest.raises(RegistryError):
        Entry.from_json(data)
    data["key"] = {"M": 1}
    data["fingerprint"]["hardware"]["compute_capability"] = 9  # once copied artifacts first
    with pytest.raises(RegistryError, match="compute_capability"):
        Entry.from_json(data)


def test_entry_missing_field_is_named(make_entry):
    data = make_entry().to_json()
    del data["best"]
    with pytest.raises(RegistryError, match="best"):
        Entry.from_json(data)


def test_merge_keeps_earliest_tuning_and_every_measurement(make_entry):
    early = make_entry(created="2026-11-21T10:00:00+00:00", block_m=64)
    late = make_entry(created="2026-11-21T11:00:00+00:00", block_m=128)
    merged = late.merge(early)
    assert merged.best == early.best
    configs = {m.config for m in merged.measurements}
    assert configs == {m.config for m in early.measurements} | {m.config for m in late.measurements}


def test_merge_refuses_different_slots(make_entry):
    with pytest.raises(RegistryError, match="different slots"):
        make_entry(m=1024).merge(make_entry(m=2048))


def test_shape_slug_is_filesystem_safe_and_bounded():
    slug = shape_slug({"dtype": "torch.bfloat16", "shape": [1, 2], "name": "a/b c" * 40})
    assert "/" not in slug and " " not in slug and len(slug) <= 80


_created = st.sampled_from(["2026-01-01T00:00:00+00:00", "2026-06-01T00:00:00+00:00"])
_median = st.floats(min_value=0.001, max_value=100, allow_nan=False)


@st.composite
def _entries(draw, base):
    configs = [KernelConfig.make({"BLOCK_M": b}) for b in (16, 32, 64, 128)]
    chosen = draw(st.lists(st.sampled_from(configs), min_size=1, max_size=4, unique=True))
    ms = tuple(Measurement(c, draw(_median), 0.0, 0.0) for c in chosen)
    return Entry(
        base.kernel,
        base.key_json,
        base.fingerprint,
        chosen[0],
        ms,
        created=draw(_created),
        host=draw(st.sampled_from(["a", "b"])),
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # the fixture is a pure factory
@given(data=st.data())
def test_merge_is_idempotent_commutative_associative(make_entry, data):
    base = make_entry()
    a, b, c = (data.draw(_entries(base)) for _ in range(3))
    assert a.merge(a).merge(a) == a.merge(a)
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(b).merge(b) == a.merge(b)
