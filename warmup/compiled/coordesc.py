"""Keep max-autotune's coordinate-descent winners when a graph loads from the cache.

On a static-launcher reload of an FX graph (``CachingAutotuner.recheck_autotune_cache``),
torch before 2.12 reads the autotune cache's best config but applies it only where the
kernel was compiled with more than one config, and never marks the kept config as found by
coordinate descent: the kernel's first call tunes again (benchmarks, and compiles of the
configs it tries) in every process that loads the graph, a fleet's warm servers included
(pytorch issue 172819, fixed by pull request 173391 for 2.12). :func:`install` gives those
torch versions the reload that 2.12 does; later versions are left as they are.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

FIXED_IN = (2, 12)
_MARK = "_triton_warmup_keeps_coordesc"


def install(heuristics: ModuleType | None = None, version: str | None = None) -> bool:
    """Replace the reload's recheck on a torch that needs it; True when it is (now or
    before) in place. ``heuristics``/``version``: Inductor's runtime module and torch's
    version (default: this process's), for tests."""
    if version is None:
        import torch  # torch loads on first use

        version = str(torch.__version__)
    if not needs_fix(version):
        return False
    if heuristics is None:
        try:
            from torch._inductor.runtime import triton_heuristics  # torch loads on first use
        except ImportError:
            return False
        heuristics = triton_heuristics
    tuner = getattr(heuristics, "CachingAutotuner", None)
    current = getattr(tuner, "recheck_autotune_cache", None)
    needed = ("check_autotune_cache", "triton_config_to_hashable")
    if current is None or not all(hasattr(heuristics, name) for name in needed):
        log.debug("torch %s has no autotune-cache recheck to fix", version)
        return False
    if not getattr(current, _MARK, False):
        recheck = _recheck(heuristics)
        setattr(recheck, _MARK, True)
        tuner.recheck_autotune_cache = recheck  # type: ignore[union-attr]
        log.debug("torch %s: coordinate-descent winners kept on a cache reload", version)
    return True


def needs_fix(version: str) -> bool:
    """Whether torch ``version`` (``2.11.0+cu130``) throws the winners away."""
    parts = version.split("+")[0].split(".")[:2]
    try:
        major, minor = (int(p) for p in parts)
    except ValueError:
        return False
    return (major, minor) < FIXED_IN


def _recheck(heuristics: ModuleType) -> Any:
    def recheck_autotune_cache(self: Any, reload_kernel_from_src: Any) -> None:
        """The autotune cache's best config, with its coordinate-descent mark, becomes
        the kernel's only config: compiled now when it is not among those loaded."""
        configs = [result.config for result in self.compile_results]
        cached, _, info = heuristics.check_autotune_cache(
            configs, self.filename, self.inductor_meta
        )
        self.autotune_cache_info = info
        if len(cached) != 1:
            return
        best = cached[0]
        by_coordesc = getattr(best, "found_by_coordesc", False)
        wanted = heuristics.triton_config_to_hashable(best)
        for result in self.compile_results:
            if heuristics.triton_config_to_hashable(result.config) == wanted:
                result.config.found_by_coordesc = by_coordesc
                self.compile_results = [result]
                return
        if self.fn.fn is None:  # dropped for pickling: the source is read again
            self.fn = reload_kernel_from_src().fn
        self.compile_results = [self._precompile_config(best)]

    return recheck_autotune_cache
