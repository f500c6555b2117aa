"""Compile every candidate in parallel before benchmarking, for exactly the specialisation
the launch will use, so each launch then hits the compile cache.

1. ``capture``: run each candidate's compile-only warm-up with Triton's
   ``knobs.runtime.jit_cache_hook`` set to record the JIT's own serialised specialisation
   (signature, constexprs, attributes, options) and skip the compile.
2. ``compile``: worker processes (forked: the kernel modules are already imported) rebuild
   the same ``ASTSource`` and call ``triton.compile`` for the explicit target, as Triton's
   ``JITFunction.preload`` does; no GPU is touched there. The artifacts land in the shared
   TRITON_CACHE_DIR under the key the JIT computes.
3. The caller warms each candidate up again: the JIT finds it on disk. ``cache_files``
   counts files before and after, which proves the hit (nothing new written).

Where fork is unavailable the pool is skipped and the warm-up compiles in-process.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.core import triton_internals
from registry.core.errors import named
from warmup.tuning.cpus import usable_cpus


@dataclass
class PoolReport:
    specializations: int = 0
    compiled: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 0


@contextmanager
def capture() -> Iterator[list[str]]:
    """While active, JIT compiles are recorded (their specialisation data) and skipped."""
    captured: list[str] = []

    def hook(**arguments: Any) -> bool:
        captured.append(triton_internals.hooked_specialization(arguments))
        return True

    previous = triton_internals.jit_cache_hook()
    triton_internals.set_jit_cache_hook(hook)
    try:
        yield captured
    finally:
        triton_internals.set_jit_cache_hook(previous)


def compile_all(
    specializations: Iterable[str], *, workers: int | None = None, target: Any = None
) -> PoolReport:
    """Compile captured specialisations in forked workers into TRITON_CACHE_DIR, for
    ``target`` (default: this process's GPU); ``workers`` (default: the CPUs this
    process may use, ``warmup.tuning.cpus``) at most, one per specialisation."""
    specs = list(dict.fromkeys(specializations))
    report = PoolReport(specializations=len(specs))
    if not specs:
        return report
    if "fork" not in multiprocessing.get_all_start_methods():
        return report  # the in-process warm-up will compile them
    if target is None:
        target = triton_internals.current_target()
    report.workers = max(1, min(len(specs), workers or usable_cpus()))
    started = time.perf_counter()
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=report.workers, mp_context=context) as pool:
        for error in pool.map(_compile_one, specs, [target] * len(specs)):
            if error is None:
                report.compiled += 1
            else:
                report.failed.append(error)
    report.seconds = time.perf_counter() - started
    return report


def precompile(warmups: Iterable[Callable[[], Any]], *, workers: int | None = None) -> PoolReport:
    """Capture every warm-up's specialisation, compile them all in parallel."""
    with capture() as captured:
        for warm in warmups:
            try:
                warm()
            except Exception:  # a candidate that cannot even specialise fails later, scored inf
                continue
    return compile_all(captured, workers=workers)


def cache_files(cache_dir: Path) -> int:
    """Compiled kernels in the cache: one group file each (a launch that hits adds none;
    Triton's C launcher stubs, built on a signature's first launch, are not counted)."""
    return sum(1 for _ in cache_dir.glob("*/__grp__*.json")) if cache_dir.is_dir() else 0


def _compile_one(spec_json: str, target: Any) -> str | None:
    """Worker: compile one captured specialisation; the error as text, never raised."""
    try:
        triton_internals.compile_specialization(spec_json, target)
        return None
    except Exception as e:  # reported, never fatal: the in-process warm-up will retry
        return named(e)
