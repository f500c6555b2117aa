"""Room in cuBLASLt's heuristics cache for every GEMM shape a serving op prepares.

cuBLAS chooses a kernel at the first GEMM of each shape and keeps the choice in a cache
of 8192 entries by default (``CUBLASLT_HEURISTICS_CACHE_CAPACITY`` sets it at the
library's start), least recently used out first. A serving op makes that choice at
every M its layer will be called with, off the request path
(``AgGemmServed.prepare``): one entry per M, per layer, per alignment. Two layers of
4096 Ms fill the default cache, and more layers overflow it. The shapes prepared first
are then chosen again on a request. On 1 H100 a choice cost 466 us of host time at the
median and 4.5 ms at p90, against 27 us for a GEMM whose choice is kept.

:func:`make_room` counts the GEMM shapes prepared in this process and, before they run,
raises the cache's capacity to hold them all, plus the default capacity, kept for the
process's own GEMMs. It only raises it: a larger capacity set by the variable stays.
Raising it keeps what the cache holds (measured on the H100). Where the library cannot
be reached (no ``libcublasLt`` loaded, another platform), it warns once and leaves the
cache as it is.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESERVE = 8192  # room kept for the process's own GEMMs: cuBLASLt's default capacity
STEP = 1024  # capacities are raised to a multiple of this

_lock = threading.Lock()
_prepared = 0  # GEMM shapes counted by make_room in this process
_warned = False


def make_room(gemms: int, load: Any = None) -> int | None:
    """Count ``gemms`` more prepared GEMM shapes and raise the capacity to hold every
    shape counted, plus :data:`RESERVE`. ``load``: called once if cuBLASLt is not
    loaded yet (a first GEMM loads it). Returns the capacity, None if unreachable."""
    global _prepared
    with _lock:
        _prepared += gemms
        library = _library(load)
        current = None if library is None else _capacity(library)
        if library is None or current is None:
            _warn_once(_prepared)
            return None
        wanted = -(-(_prepared + RESERVE) // STEP) * STEP
        if current >= wanted:
            return current
        if library.cublasLtHeuristicsCacheSetCapacity(ctypes.c_size_t(wanted)) != 0:
            _warn_once(_prepared)
            return current
        log.info(
            "cuBLASLt heuristics cache: %d -> %d entries, to keep the kernel cuBLAS chose "
            "at each of the %d GEMM shapes serving ops prepared",
            current,
            wanted,
            _prepared,
        )
        return wanted


def _capacity(library: Any) -> int | None:
    value = ctypes.c_size_t()
    if library.cublasLtHeuristicsCacheGetCapacity(ctypes.byref(value)) != 0:
        return None
    return int(value.value)


def _library(load: Any) -> Any:
    """The process's loaded libcublasLt (the one torch's GEMMs use), or None."""
    path = _loaded_path()
    if path is None and load is not None:
        load()
        path = _loaded_path()
    if path is None:
        return None
    try:
        library = ctypes.CDLL(path)  # already loaded: the same library, its state
        library.cublasLtHeuristicsCacheGetCapacity  # noqa: B018 - present, or AttributeError
        library.cublasLtHeuristicsCacheSetCapacity  # noqa: B018
    except (OSError, AttributeError):
        return None
    return library


def _loaded_path(maps: Path = Path("/proc/self/maps")) -> str | None:
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        if len(fields) == 6 and "/libcublasLt.so" in fields[5]:
            return fields[5].strip()
    return None


def _warn_once(prepared: int) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "cuBLASLt's heuristics cache could not be read or resized here; serving ops "
            "have prepared %d GEMM shapes so far. If that passes its capacity (8192 by "
            "default), a request at a shape prepared first pays cuBLAS's choice again: "
            "set CUBLASLT_HEURISTICS_CACHE_CAPACITY in the serving container to hold them",
            prepared,
        )
