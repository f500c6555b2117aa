import math

import pytest

from registry import KernelConfig, Measurement, RegistryError


def test_config_is_a_hashable_value_with_order_free_kwargs():
    a = KernelConfig.make({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4)
    b = KernelConfig.make({"BLOCK_N": 128, "BLOCK_M": 64}, num_warps=4)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != KernelConfig.make({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=8)


def test_config_json_round_trip_is_structured():
    config = KernelConfig.make(
        {"BLOCK_M": 64, "SPLIT": True}, num_warps=8, num_stages=4, maxnreg=128
    )
    data = config.to_json()
    assert data == {
        "kwargs": {"BLOCK_M": 64, "SPLIT": True},
        "num_warps": 8,
        "num_stages": 4,
        "num_ctas": 1,
        "maxnreg": 128,
    }
    assert KernelConfig.from_json(data) == config


def test_config_reads_tritons_own_config_dict():
    # triton.Config.__dict__, as Triton writes it into *.autotune.json
    triton_dict = {
        "kwargs": {"BLOCK_SIZE": 1024},
        "num_warps": 4,
        "num_ctas": 1,
        "num_stages": 2,
        "maxnreg": None,
        "pre_hook": None,
        "ir_override": None,
    }
    config = KernelConfig.from_json(triton_dict)
    assert config.meta == {"BLOCK_SIZE": 1024} and config.num_stages == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"kwargs": [1, 2]},
        {"kwargs": {"BLOCK": [64]}},
        {"kwargs": {}, "num_warps": "8"},
        {"kwargs": {}, "num_warps": True},
        "BLOCK_M: 64",
    ],
)
def test_config_rejects_bad_input_by_name(bad):
    with pytest.raises(RegistryError):
        KernelConfig.from_json(bad)


def test_unknown_launch_option_is_named():
    with pytest.raises(RegistryError, match="num_wraps"):
        KernelConfig.make({}, num_wraps=4)


def test_measurement_keeps_failures_with_their_reason():
    config = KernelConfig.make({"BLOCK_M": 256})
    failed = Measurement(config, error="ptxas: out of registers")
    assert not failed.ok and math.isinf(failed.median_ms)
    data = failed.to_json()
    assert data["median_ms"] is None and data["error"] == "ptxas: out of registers"
    assert Measurement.from_json(data) == failed
    ok = Measurement(config, 1.5, 1.4, 1.7)
    assert Measurement.from_json(ok.to_json()) == ok and ok.ok


def test_measurement_rejects_negative_time():
    with pytest.raises(RegistryError, match="median_ms"):
        Measurement.from_json({"config": {"kwargs": {}}, "median_ms": -1})


def test_all_kwargs_carries_every_launch_option_that_is_set():
    config = KernelConfig.make({"BLOCK_M": 64}, num_warps=8, num_stages=4, num_ctas=2, maxnreg=128)
    assert config.all_kwargs() == {
        "BLOCK_M": 64,
        "num_warps": 8,
        "num_stages": 4,
        "num_ctas": 2,
        "maxnreg": 128,
    }
    assert "maxnreg" not in KernelConfig.make({"BLOCK_M": 64}).all_kwargs()
