"""Room in cuBLASLt's heuristics cache: raised before the prepared shapes run, to hold
all of them plus the process's starting capacity; never lowered; a library that cannot
be reached warns once."""

import ctypes
import logging

import pytest

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


@pytest.fixture
def library(monkeypatch):
    fake = FakeLibrary()
    monkeypatch.setattr(cublas_heuristics, "_prepared", 0)
    monkeypatch.setattr(cublas_heuristics, "_warned", False)
    monkeypatch.setattr(cublas_heuristics, "_library", lambda load: fake)
    return fake


def test_room_for_every_prepared_shape_plus_the_default_capacity(library, caplog):
    caplog.set_level(logging.INFO, logger="kernels.cublas_heuristics")
    assert cublas_heuristics.make_room(4096) == 8192 + 4096  # one layer's Ms
    assert cublas_heuristics.make_room(4096) == 8192 + 8192  # a second layer's
    assert library.sets == [12288, 16384]
    assert "8192 -> 12288 entries" in caplog.text and "4096 GEMM shapes" in caplog.text
    assert cublas_heuristics.make_room(1) == 17408  # rounded up to a multiple of STEP
    assert cublas_heuristics.make_room(0) == 17408 and len(library.sets) == 3  # room kept


def test_a_larger_capacity_set_by_the_user_is_kept_until_the_shapes_need_more(library):
    library.capacity = 65536  # CUBLASLT_HEURISTICS_CACHE_CAPACITY set by the user
    assert cublas_heuristics.make_room(4096) == 65536 and library.sets == []
    assert cublas_heuristics.make_room(60000) == 72704  # 64096 + 8192 = 72288, rounded up


def test_an_unreachable_or_refusing_library_warns_once_and_changes_nothing(
    monkeypatch, library, caplog
):
    library.set_status = 7  # CUBLAS_STATUS_INVALID_VALUE, say
    assert cublas_heuristics.make_room(9000) == 8192
    library.get_status = 1
    assert cublas_heuristics.make_room(9000) is None
    monkeypatch.setattr(cublas_heuristics, "_library", lambda load: None)
    assert cublas_heuristics.make_room(9000) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "CUBLASLT_HEURISTICS_CACHE_CAPACITY" in warnings[0].message
    assert library.capacity == 8192


def test_the_loaded_library_is_found_in_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 00:00 0 \n"
        "7f01-7f02 r-xp 00001000 fd:01 1234   /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00001000 fd:01 5678   /opt/nvidia/cu13/lib/libcublasLt.so.13\n"
    )
    assert cublas_heuristics._loaded_path(maps) == "/opt/nvidia/cu13/lib/libcublasLt.so.13"
    maps.write_text("7f01-7f02 r-xp 00001000 fd:01 1234   /usr/lib/libc.so.6\n")
    assert cublas_heuristics._loaded_path(maps) is None
    assert cublas_heuristics._loaded_path(tmp_path / "absent") is None


def test_a_library_not_loaded_yet_is_loaded_once_then_looked_up(monkeypatch):
    loads = []
    monkeypatch.setattr(cublas_heuristics, "_loaded_path", lambda: None)
    assert cublas_heuristics._library(lambda: loads.append(1)) is None
    assert loads == [1]
