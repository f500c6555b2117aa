"""Room in cuBLASLt's heuristics cache: raised before the prepared shapes run, to hold
all of them plus the process's starting capacity; never lowered; a library that cannot
be reached warns once."""

import ctypes
import logging

from kernels import cublas_heuristics


class FakeLibrary:
    """cublasLtHeuristicsCache{Get,Set}Capacity over a number, with ctypes arguments."""

    def __init__(self, capacity=8192, get_status=0, set_status=0):
        self.capacity, self.get_status, self.set_status = capacity, get_status, set_status
        self.sets = []

    def cublasLtHeuristicsCacheGetCapacity(self, pointer):
        ctypes.cast(pointer, ctypes.POINTER(ctypes.c_size_t)).contents.value = self.capacity
        return self.get_status

    def cublasLtHeuristicsCacheSetCapacity(self, capacity):
        self.sets.append(capacity.value)
        if self.set_status == 0:
            self.capacity = capacity.value
        return self.set_status


def _cache(library):
    found = []

    def find(load):
        found.append(load)
        return library

    cache = cublas_heuristics.HeuristicsCache(find)
    return cache, found


def _shapes(count, n=1536, start=1):
    return [(m, n, 4096, "bf16", False) for m in range(start, start + count)]


def test_room_for_every_prepared_shape_plus_the_default_capacity(caplog):
    caplog.set_level(logging.INFO, logger="kernels.cublas_heuristics")
    library = FakeLibrary()
    cache, found = _cache(library)
    assert cache.make_room(_shapes(4096)) == 8192 + 4096  # one layer's Ms
    assert cache.make_room(_shapes(4096, n=7168)) == 8192 + 8192  # a second layer's
    assert library.sets == [12288, 16384] and len(found) == 1  # looked up once
    assert "8192 -> 12288 entries" in caplog.text and "4096 GEMM shapes" in caplog.text
    assert cache.make_room(_shapes(1, start=5000)) == 17408  # rounded up to a STEP
    assert cache.make_room([]) == 17408 and len(library.sets) == 3  # room kept


def test_shapes_prepared_again_are_counted_once_and_raise_nothing():
    library = FakeLibrary()
    cache, _ = _cache(library)
    cache.make_room(_shapes(4096))
    library.capacity = 9000  # lowered behind its back: a refresh of the same Ms leaves it
    assert cache.make_room(_shapes(4096)) == 9000 and library.sets == [12288]


def test_a_capacity_set_by_the_user_is_kept_unless_the_shapes_need_more():
    library = FakeLibrary(capacity=65536)  # CUBLASLT_HEURISTICS_CACHE_CAPACITY=65536
    cache, _ = _cache(library)
    assert cache.make_room(_shapes(4096)) == 65536 and library.sets == []
    assert cache.make_room(_shapes(60000, start=5000)) == 72704  # 64096 + 8192, rounded up
    off = FakeLibrary(capacity=0)  # the variable at 0 turns the cache off: left off
    cache, _ = _cache(off)
    assert cache.make_room(_shapes(9000)) == 0 and off.sets == []


def test_an_unreachable_or_refusing_library_warns_once_and_changes_nothing(caplog):
    library = FakeLibrary(set_status=7)  # CUBLAS_STATUS_INVALID_VALUE, say
    cache, _ = _cache(library)
    assert cache.make_room(_shapes(9000)) == 8192
    library.get_status = 1
    assert cache.make_room(_shapes(10, start=9001)) is None
    absent, found = _cache(None)
    assert absent.make_room(_shapes(9000)) is None and absent.make_room(_shapes(1)) is None
    assert len(found) == 1  # not looked up again on every prepare
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "CUBLASLT_HEURISTICS_CACHE_CAPACITY" in warnings[0].message
    assert library.capacity == 8192


def test_the_loaded_library_is_found_in_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 00:00 0 \n"
        "7f01-7f02 r-xp 00001000 fd:01 1234   /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00001000 fd:01 5678   /opt/nvidia/cu13/lib/libcublasLt.so.13\n"
    )
    assert cublas_heuristics.loaded_path(maps) == "/opt/nvidia/cu13/lib/libcublasLt.so.13"
    maps.write_text("7f01-7f02 r-xp 00001000 fd:01 1234   /usr/lib/libc.so.6\n")
    assert cublas_heuristics.loaded_path(maps) is None
    assert cublas_heuristics.loaded_path(tmp_path / "absent") is None


def test_a_library_not_loaded_yet_is_loaded_once_then_looked_up(monkeypatch):
    loads = []
    monkeypatch.setattr(cublas_heuristics, "loaded_path", lambda: None)
    assert cublas_heuristics._find_library(lambda: loads.append(1)) is None
    assert loads == [1]
