"""The reload that keeps coordinate-descent winners, on a stand-in of Inductor's module."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from warmup.compiled import coordesc


@dataclass
class Config:
    block: int
    found_by_coordesc: bool = False


@dataclass
class Result:
    config: Config


def heuristics(best: list[Config]) -> ModuleType:
    """Inductor's runtime module as the recheck uses it: the autotune cache answers ``best``."""
    module = ModuleType("fake_heuristics")
    asked: list[Any] = []

    def check_autotune_cache(configs: list[Config], filename: str, meta: dict[str, Any]) -> Any:
        asked.append((configs, filename, meta))
        return [Config(c.block, c.found_by_coordesc) for c in best], None, {"hit": bool(best)}

    class CachingAutotuner:
        def recheck_autotune_cache(self, reload_kernel_from_src: Any) -> None:
            raise AssertionError("the original recheck ran")

    module.check_autotune_cache = check_autotune_cache  # type: ignore[attr-defined]
    module.triton_config_to_hashable = lambda c: c.block  # type: ignore[attr-defined]
    module.CachingAutotuner = CachingAutotuner  # type: ignore[attr-defined]
    module.asked = asked  # type: ignore[attr-defined]
    return module


@dataclass
class Tuner:
    compile_results: list[Result]
    filename: str = "k.py"
    inductor_meta: dict[str, Any] = field(default_factory=dict)
    fn: Any = field(default_factory=lambda: SimpleNamespace(fn=object()))
    compiled: list[Config] = field(default_factory=list)
    autotune_cache_info: Any = None

    def _precompile_config(self, config: Config) -> Result:
        self.compiled.append(config)
        return Result(config)


def recheck(module: ModuleType, tuner: Tuner, reload: Any = None) -> None:
    module.CachingAutotuner.recheck_autotune_cache(tuner, reload)  # type: ignore[attr-defined]


def test_a_single_compiled_config_is_marked_as_the_coordesc_winner() -> None:
    module = heuristics([Config(64, found_by_coordesc=True)])
    assert coordesc.install(module, "2.11.0+cu130")
    tuner = Tuner([Result(Config(64))])
    recheck(module, tuner)
    assert [r.config.block for r in tuner.compile_results] == [64]
    assert tuner.compile_results[0].config.found_by_coordesc
    assert tuner.autotune_cache_info == {"hit": True} and tuner.compiled == []


def test_the_winner_among_several_is_kept_alone_with_its_mark() -> None:
    module = heuristics([Config(128, found_by_coordesc=True)])
    coordesc.install(module, "2.11.0")
    tuner = Tuner([Result(Config(64)), Result(Config(128)), Result(Config(256))])
    recheck(module, tuner)
    assert [(r.config.block, r.config.found_by_coordesc) for r in tuner.compile_results] == [
        (128, True)
    ]


def test_a_winner_not_loaded_is_compiled_reloading_the_source_when_dropped() -> None:
    module = heuristics([Config(32, found_by_coordesc=True)])
    coordesc.install(module, "2.11.0")
    tuner = Tuner([Result(Config(64))], fn=SimpleNamespace(fn=None))
    source = SimpleNamespace(fn=object())
    recheck(module, tuner, lambda: SimpleNamespace(fn=source))
    assert tuner.fn is source and [c.block for c in tuner.compiled] == [32]
    assert tuner.compile_results[0].config.found_by_coordesc


def test_no_cache_hit_leaves_the_compiled_configs() -> None:
    module = heuristics([])
    coordesc.install(module, "2.11.0")
    results = [Result(Config(64)), Result(Config(128))]
    tuner = Tuner(list(results))
    recheck(module, tuner)
    assert tuner.compile_results == results and tuner.autotune_cache_info == {"hit": False}


def test_installing_twice_wraps_once_and_fixed_versions_are_left_alone() -> None:
    module = heuristics([Config(64)])
    assert coordesc.install(module, "2.11.0")
    first = module.CachingAutotuner.recheck_autotune_cache  # type: ignore[attr-defined]
    assert coordesc.install(module, "2.11.0")
    assert module.CachingAutotuner.recheck_autotune_cache is first  # type: ignore[attr-defined]
    fixed = heuristics([Config(64)])
    assert not coordesc.install(fixed, "2.12.0")
    with pytest.raises(AssertionError, match="original"):
        recheck(fixed, Tuner([Result(Config(64))]))


@pytest.mark.parametrize(
    ("version", "needed"),
    [
        ("2.11.0+cu130", True),
        ("2.10.1", True),
        ("2.12.0", False),
        ("2.13.0+cpu", False),
        ("3.0.0a0", False),
        ("nightly", False),
    ],
)
def test_which_versions_need_it(version: str, needed: bool) -> None:
    assert coordesc.needs_fix(version) is needed


def test_a_torch_without_the_recheck_is_left_alone() -> None:
    module = ModuleType("old")
    assert not coordesc.install(module, "2.5.0")


def test_this_torch_is_patched_only_where_it_needs_it() -> None:
    import torch
    from torch._inductor.runtime import triton_heuristics

    before = triton_heuristics.CachingAutotuner.recheck_autotune_cache
    installed = coordesc.install()
    assert installed is coordesc.needs_fix(str(torch.__version__))
    if not installed:
        assert triton_heuristics.CachingAutotuner.recheck_autotune_cache is before
