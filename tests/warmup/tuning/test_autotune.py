"""The decorator: Triton-distributed's call conventions, backed by the registry."""

import pytest
import torch
import triton

from registry import KernelConfig, Store, cpu_fingerprint
from registry.locks import backend_from_url
from warmup.tuning.autotune import autotune, to_key
from warmup.tuning.tuner import TuneError, TuneOptions

TIMES = {32: 2.0, 64: 0.5, 128: 1.0}


def decorated(tmp_path, calls, **extra):
    last = {}

    def timer(fn, repetitions, meet=None):
        fn()
        return [TIMES[last["block"]]] * repetitions

    space = [
        {"gemm_config": triton.Config({"BLOCK": b}, num_warps=4, num_stages=3), "SPLIT": 1}
        for b in TIMES
    ]

    @autotune(
        config_space=space,
        key_fn=lambda a, scale: (a.shape, a.dtype),
        prune_fn=lambda config, a, scale: config["gemm_config"].kwargs["BLOCK"] <= a.shape[0],
        store=Store(tmp_path / "registry", create=True),
        fingerprint=cpu_fingerprint(),
        timer=timer,
        lock_backend=backend_from_url(str(tmp_path / "locks")),
        **extra,
    )
    def scaled(a, scale, gemm_config, SPLIT):
        block = gemm_config.kwargs["BLOCK"]
        last["block"] = block
        calls.append((block, gemm_config.num_warps, SPLIT))
        return a * scale

    return scaled


def test_tunes_once_then_uses_the_stored_best(tmp_path):
    calls = []
    fn = decorated(tmp_path, calls)
    a = torch.ones(100, 4)
    assert torch.equal(fn(a, 2.0), a * 2.0)
    assert calls[-1] == (64, 4, 1)  # called with the winner, rebuilt as a triton.Config
    assert {c[0] for c in calls} == {32, 64}  # 128 pruned: larger than a.shape[0]
    entry = Store(tmp_path / "registry").entries()[0]
    assert entry.best == KernelConfig.make({"BLOCK": 64, "SPLIT": 1}, num_warps=4, num_stages=3)
    assert entry.key == {"key": [[100, 4], "torch.float32"]}
    calls.clear()
    fresh = decorated(tmp_path, calls)  # a new process: the registry answers
    fresh(a, 3.0)
    assert calls == [(64, 4, 1)]


def test_autotune_false_runs_the_first_config_without_lookup(tmp_path):
    calls = []
    decorated(tmp_path, calls)(torch.ones(8, 2), 1.0, autotune=False)
    assert calls == [(32, 4, 1)]
    assert not (tmp_path / "registry").exists()  # nothing stored, not even a folder


def test_verbose_prints_the_decision(tmp_path, capsys):
    decorated(tmp_path, [])(torch.ones(100, 2), 1.0, autotune_verbose=True)
    assert "tuned config BLOCK=64 SPLIT=1 w4 s3" in capsys.readouterr().out


def test_space_keywords_cannot_be_passed_and_policy_applies(tmp_path):
    fn = decorated(tmp_path, [])
    with pytest.raises(ValueError, match="come from the config space"):
        fn(torch.ones(4, 4), 1.0, SPLIT=2)
    strict = decorated(tmp_path, [], options=TuneOptions(policy="fail"))
    with pytest.raises(TuneError, match="policy is 'fail'"):
        strict(torch.ones(64, 4), 1.0)


def test_keys_become_json_objects():
    assert to_key((torch.Size([2, 3]), torch.bfloat16)) == {"key": [[2, 3], "torch.bfloat16"]}
    assert to_key({"M": 4}) == {"M": 4}


def test_a_changed_config_space_is_a_miss_that_tunes_again(tmp_path):
    calls = []
    decorated(tmp_path, calls)(torch.ones(100, 4), 1.0)  # stores BLOCK=64
    registry = tmp_path / "registry"
    seen = []

    def timer(fn, repetitions, meet=None):
        fn()
        return [1.0] * repetitions

    @autotune(
        config_space=[{"gemm_config": triton.Config({"BLOCK": 16}, num_warps=2), "SPLIT": 1}],
        key_fn=lambda a, scale: (a.shape, a.dtype),
        kernel=Store(registry).entries()[0].kernel,  # the same kernel name, a new space
        store=Store(registry, create=True),
        fingerprint=cpu_fingerprint(),
        timer=timer,
        lock_backend=backend_from_url(str(tmp_path / "locks")),
    )
    def scaled(a, scale, gemm_config, SPLIT):
        seen.append(gemm_config.kwargs["BLOCK"])
        return a * scale

    assert torch.equal(scaled(torch.ones(100, 4), 2.0), torch.full((100, 4), 2.0))
    assert set(seen) == {16} and scaled.stats.tuned == 1
    assert len(Store(registry).entries()) == 2  # the old space's entry stays for its users


def test_every_launch_option_of_a_config_reaches_the_function(tmp_path):
    received = []
    config = KernelConfig.make({"BLOCK": 8}, num_warps=4, num_stages=2, num_ctas=1, maxnreg=128)

    @autotune(
        config_space=[config],
        key_fn=lambda a: a.shape,
        store=Store(tmp_path / "registry", create=True),
        fingerprint=cpu_fingerprint(),
        timer=lambda fn, repetitions, meet=None: [fn(), 1.0][1:] * repetitions,
        lock_backend=backend_from_url(str(tmp_path / "locks")),
    )
    def launch(a, **options):
        received.append(options)
        return a

    launch(torch.ones(2))
    assert received[-1] == {
        "BLOCK": 8,
        "num_warps": 4,
        "num_stages": 2,
        "num_ctas": 1,
        "maxnreg": 128,
    }
