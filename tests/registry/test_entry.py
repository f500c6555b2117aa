import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import Entry, KernelConfig, Measurement, RegistryError, canonical_key
from registry.entry import SCHEMA_VERSION, shape_slug


def test_canonical_key_ignores_order_and_rejects_non_json():
    assert canonical_key({"b": 1, "a": [2, 3]}) == canonical_key({"a": [2, 3], "b": 1})
    for bad in ({"x": object()}, {"x": float("nan")}, {1: 2}, [("M", 1)]):
        with pytest.raises(RegistryError):
            canonical_key(bad)


def test_entry_round_trips_every_field(make_entry):
    entry = make_entry()
    data = json.loads(json.dumps(entry.to_json()))
    assert data["schema"] == SCHEMA_VERSION
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


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("schema", 99, "schema"),
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
