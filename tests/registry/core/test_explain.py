"""Predictions: what is counted, which factor is named, and the line a person reads."""

from __future__ import annotations

import pytest

from registry.core.explain import fingerprint_differences, predict
from tests.conftest import gpu_fingerprint


def test_everything_usable_is_a_hit_and_nothing_stored_is_empty():
    assert predict("f", [{}, {}]).outcome == "hit"
    assert predict("f", []).outcome == "empty"
    assert predict("f", []).line() == "f: EMPTY: nothing stored"


def test_some_usable_is_partial_none_is_a_miss_and_the_line_names_the_factor():
    cc = {"compute capability": ("10.0", "9.0")}
    partial = predict("triton-kernels", [{}, cc, cc])
    assert (partial.outcome, partial.usable, partial.held) == ("partial", 1, 3)
    assert partial.line() == (
        "triton-kernels: PARTIAL: 1 of 3 stored usable; "
        "compute capability differs: stored 9.0, this host 10.0"
    )
    assert predict("triton-kernels", [cc]).outcome == "miss"


def test_the_factor_keeping_most_things_out_is_named_then_the_earliest_in_order():
    env = {"env TRITON_DEFAULT_FP_FUSION": (None, "0")}
    version = {"Triton version": ("3.6.0", "3.5.1"), "ptxas": ("12.8", "12.4")}
    assert predict("f", [env, env, version]).factor == "env TRITON_DEFAULT_FP_FUSION"
    # within one thing, the first in order: a new Triton brings its own ptxas
    assert predict("f", [version]).factor == "Triton version"
    assert predict("f", [env, version]).factor == "Triton version"  # a tie: the earlier
    assert predict("f", [env]).line().endswith("stored 0, this host unset")


def test_declared_things_stored_nowhere_are_counted_apart():
    alone = predict("inductor", [], missing=2)
    assert alone.outcome == "miss"
    assert alone.line() == "inductor: MISS: 2 declared and not stored (compiled at warmup)"
    mixed = predict("inductor", [{}], missing=1)
    assert mixed.outcome == "partial"
    assert "1 of 1 stored usable, 1 declared and not stored" in mixed.line()


FINGERPRINT_FACTORS = [  # a software field of a fingerprint changed, and its factor
    ({"torch": "2.12.0"}, "torch"),
    ({"triton": "3.7.0"}, "Triton version"),
    ({"triton_hash": "u" * 16}, "Triton build"),
    ({"cuda_runtime": "13.0"}, "CUDA"),
    ({"driver": "580.65"}, "driver"),
    ({"ptxas": "13.0"}, "ptxas"),
]


@pytest.mark.parametrize(("change", "factor"), FINGERPRINT_FACTORS)
def test_a_fingerprints_fields_are_named_as_factors(change, factor):
    differences = gpu_fingerprint(**change).diff(gpu_fingerprint())
    assert predict("f", [fingerprint_differences(differences)]).factor == factor


def test_hardware_fields_are_named_as_factors():
    gpu = fingerprint_differences(gpu_fingerprint("NVIDIA B200").diff(gpu_fingerprint()))
    assert predict("f", [gpu]).factor == "GPU model"
    arch = gpu_fingerprint("NVIDIA B200", cc="10.0").diff(gpu_fingerprint())
    assert predict("f", [fingerprint_differences(arch)]).factor == "GPU model"
    sms = fingerprint_differences(gpu_fingerprint(sms=114).diff(gpu_fingerprint()))
    assert predict("f", [sms]).factor == "hardware.sm_count"
