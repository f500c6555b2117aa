"""What torch.compile did in this process, read from Dynamo's and Inductor's own
counters: the figures a warm model must keep at zero on the request path."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CompileCounts:
    """Counts since the process started (or between two snapshots, by subtraction)."""

    dynamo_frames: int = 0  # frames Dynamo compiled (a recompile is one more)
    graphs: int = 0  # graphs Dynamo captured
    fxgraph_hits: int = 0  # Inductor's FX graph cache
    fxgraph_misses: int = 0
    inductor_compiles: int = 0  # graphs Inductor compiled: misses and bypasses
    autograd_hits: int = 0  # AOTAutograd's cache
    autograd_misses: int = 0
    kernel_compiles: int = 0  # Triton compiles in this process (its disk cache missed)
    autotune_runs: int = 0  # every benchmark below, plus combo kernels' (the guard's label)
    gemm_autotunes: int = 0  # max-autotune's GEMM choices benchmarked (select_algorithm)
    coordesc_benchmarks: int = 0  # coordinate-descent tuning's benchmarks of one config
    config_benchmarks: int = 0  # a Triton kernel's configs benchmarked at its first call

    def __sub__(self, other: CompileCounts) -> CompileCounts:
        return CompileCounts(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )

    def __add__(self, other: CompileCounts) -> CompileCounts:
        return CompileCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    def request_costs(self) -> dict[str, int]:
        """The :data:`REQUEST_COSTS` that are not zero."""
        return {name: getattr(self, name) for name in REQUEST_COSTS if getattr(self, name)}


class _TritonCompiles:
    """Triton's compiles in this process, from its compilation listener (Triton 3.4+),
    which hears every ``triton.compile`` with whether its disk cache had the kernel; a
    listener set before is still called. Kernels Inductor compiles in its worker
    processes are not heard here: their graphs count as ``inductor_compiles``."""

    def __init__(self) -> None:
        self.compiled = 0
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        try:
            from triton import knobs  # triton loads on first use
        except ImportError:  # a Triton before knobs: compiles are not counted
            return
        previous = knobs.compilation.listener

        def listener(**event: Any) -> None:
            if not event.get("cache_hit", True):
                self.compiled += 1
            if previous is not None:
                previous(**event)

        knobs.compilation.listener = listener


_triton = _TritonCompiles()


def triton_compiles() -> int:
    """Triton's compiles in this process that its disk cache missed, since this was
    first called (the listener is installed then); imports neither torch nor Dynamo."""
    _triton.install()
    return _triton.compiled


def snapshot() -> CompileCounts:
    """The counters now (torch imported here: the caller compiles anyway)."""
    from torch._dynamo.utils import counters  # torch loads on first use

    _triton.install()
    inductor: Any = counters["inductor"]
    autograd: Any = counters["aot_autograd"]
    return CompileCounts(
        dynamo_frames=int(counters["frames"]["ok"]),
        graphs=int(counters["stats"]["unique_graphs"]),
        fxgraph_hits=int(inductor["fxgraph_cache_hit"]),
        fxgraph_misses=int(inductor["fxgraph_cache_miss"]),
        inductor_compiles=int(inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"]),
        autograd_hits=int(autograd["autograd_cache_hit"]),
        autograd_misses=int(autograd["autograd_cache_miss"]),
        kernel_compiles=_triton.compiled,
        **_autotunes(inductor),
    )


# Inductor's benchmark counters (``coordesc_tuning_bench``, ``select_algorithm_autotune``)
# are replayed from the cache entry on every FX-graph cache hit, though nothing ran (torch
# 2.11 to 2.13): the benchmarks actually run are counted from dynamo_timed's records.
_COORDESC = "CachingAutotuner.coordinate_descent_tuning"
_BENCHMARK_ALL_CONFIGS = "CachingAutotuner.benchmark_all_configs"
_COMBO = "CachingAutotuner.combo_sequential_autotune"
_TEMPLATE_AUTOTUNING = "_template_autotuning"  # "{name}_template_autotuning": a GEMM's choice


def _autotunes(inductor: Any) -> dict[str, int]:
    """Inductor's benchmarks that ran in this process, by kind, and their sum."""
    from torch._dynamo.utils import compilation_time_metrics as timed  # torch loads on first use

    kinds = {
        "gemm_autotunes": sum(
            # a copy: another thread's compile may add a name meanwhile
            len(runs)
            for name, runs in list(timed.items())
            if name.endswith(_TEMPLATE_AUTOTUNING)
        ),
        "coordesc_benchmarks": len(timed.get(_COORDESC, ())),
        "config_benchmarks": len(timed.get(_BENCHMARK_ALL_CONFIGS, ())),
    }
    return {**kinds, "autotune_runs": sum(kinds.values()) + len(timed.get(_COMBO, ()))}


REQUEST_COSTS = (
    "dynamo_frames",
    "fxgraph_misses",
    "inductor_compiles",
    "kernel_compiles",
    "autotune_runs",
)
"""What a warm model must not do on a request: each is a counter label of the guard."""
