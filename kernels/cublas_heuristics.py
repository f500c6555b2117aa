"""Room in cuBLASLt's heuristics cache for every GEMM shape a serving op prepares.

cuBLAS chooses a kernel at the first GEMM of each shape and keeps the choice in a cache
of 8192 entries by default (``CUBLASLT_HEURISTICS_CACHE_CAPACITY`` sets it at the
library's start; 0 turns it off), least recently used out first. A serving op makes
that choice at every M its layer will be called with, off the request path
(``AgGemmServed.prepare``): one entry per M, per layer, per alignment. Two layers of
4096 Ms fill the default cache, and more layers overflow it: the shapes prepared first
are then chosen again on a request (docs/benchmarks/serving.md, "First calls at a new M").

:meth:`HeuristicsCache.make_room` keeps the set of GEMM shapes prepared in the process
and, before new ones run, raises the capacity to hold them all plus :data:`RESERVE`
for the process's own GEMMs. It never lowers it, and leaves a cache turned off alone.
Raising it keeps what the cache holds (measured on an H100). Where the library cannot
be reached (no ``libcublasLt`` loaded, another platform), it warns once. Only a shape
not prepared before raises it, so a registry refresh that rebuilds the same Ms changes
nothing while requests run.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESERVE = 8192  # room kept for the process's own GEMMs: cuBLASLt's default capacity
STEP = 1024  # capacities are raised to a multiple of this


class HeuristicsCache:
    """The process's view of cuBLASLt's heuristics cache (one per process, as the cache
    is): the shapes prepared so far, and the library, looked up once."""

    def __init__(self, find: Callable[[Callable[[], object] | None], Any] | None = None) -> None:
        self._find = find or _find_library
        self._lock = threading.Lock()
        self._shapes: set[Hashable] = set()
        self._library: Any = None
        self._looked_up = False
        self._warned = False

    def make_room(
        self, shapes: Iterable[Hashable], *, load: Callable[[], object] | None = None
    ) -> int | None:
        """Add ``shapes`` (one key per GEMM shape and alignment) to the prepared set, and
        raise the capacity to hold the set plus :data:`RESERVE` before they run.
        ``load``: a first GEMM, run if cuBLASLt is not loaded yet. Returns the capacity,
        None where the library cannot be reached."""
        with self._lock:
            before = len(self._shapes)
            self._shapes.update(shapes)
            if not self._looked_up:
                self._library, self._looked_up = self._find(load), True
            current = None if self._library is None else _capacity(self._library)
            if current is None:
                self._warn_once()
                return None
            wanted = -(-(len(self._shapes) + RESERVE) // STEP) * STEP
            if current == 0 or current >= wanted or len(self._shapes) == before:
                return current  # turned off by the user, room enough, or nothing new
            if self._library.cublasLtHeuristicsCacheSetCapacity(ctypes.c_size_t(wanted)):
                self._warn_once()
                return current
            log.info(
                "cuBLASLt heuristics cache: %d -> %d entries, to keep the kernel cuBLAS "
                "chose at each of the %d GEMM shapes serving ops prepared",
                *(current, wanted, len(self._shapes)),
            )
            return wanted

    def _warn_once(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cuBLASLt's heuristics cache could not be read or resized here; serving "
                "ops have prepared %d GEMM shapes so far. If that passes its capacity "
                "(8192 by default), a request at a shape prepared first pays cuBLAS's "
                "choice again: set CUBLASLT_HEURISTICS_CACHE_CAPACITY in the serving "
                "container to hold them",
                len(self._shapes),
            )


def _capacity(library: Any) -> int | None:
    value = ctypes.c_size_t()
    if library.cublasLtHeuristicsCacheGetCapacity(ctypes.byref(value)) != 0:
        return None
    return int(value.value)


def _find_library(load: Callable[[], object] | None) -> Any:
    """The process's loaded libcublasLt (the one torch's GEMMs use), or None."""
    path = loaded_path()
    if path is None and load is not None:
        load()
        path = loaded_path()
    if path is None:
        return None
    try:
        library = ctypes.CDLL(path)  # already loaded: the same library, its state
        for name in ("cublasLtHeuristicsCacheGetCapacity", "cublasLtHeuristicsCacheSetCapacity"):
            getattr(library, name)  # AttributeError where this version lacks it
    except (OSError, AttributeError):
        return None
    return library


def loaded_path(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of the libcublasLt mapped into this process, or None."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        if len(fields) == 6 and "/libcublasLt.so" in fields[5]:
            return fields[5].strip()
    return None


PROCESS = HeuristicsCache()  # cuBLASLt's cache is one per process, and so is this
