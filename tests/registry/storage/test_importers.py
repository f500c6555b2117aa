import json
import math
import tracemalloc

from registry import Store
from registry.core import atomic
from registry.storage import importers
from registry.storage.importers import (
    MAX_FILE_BYTES,
    MAX_FILE_VALUES,
    import_triton_autotune,
    import_triton_autotune_files,
    import_triton_dist,
)
from registry.storage.store import MAX_ENTRY_BYTES


def _triton_config(block, warps=4, stages=3):
    # triton.Config.__dict__ as Triton's autotuner dumps it
    return {
        "kwargs": {"BLOCK_SIZE": block},
        "num_warps": warps,
        "num_ctas": 1,
        "num_stages": stages,
        "maxnreg": None,
        "pre_hook": None,
        "ir_override": None,
    }


def test_import_tritons_own_autotune_cache(tmp_path, h200):
    folder = tmp_path / "cache" / "ABCDEF"
    folder.mkdir(parents=True)
    (folder / "add_kernel.autotune.json").write_text(
        json.dumps(
            {
                "key": [98432, "torch.float32", "torch.float32"],
                "configs_timings": [
                    [_triton_config(1024), [0.020, 0.019, 0.022]],
                    [_triton_config(128, warps=2), [0.011, 0.010, 0.012]],
                    [_triton_config(4096, warps=8), [float("inf")] * 3],
                ],
            }
        )
    )
    (folder / "broken.autotune.json").write_text("{")
    result = import_triton_autotune(tmp_path / "cache", h200)
    assert len(result.errors) == 1 and "broken.autotune.json" in result.errors[0]
    (entry,) = result.entries
    assert entry.kernel == "add_kernel" and entry.source == "triton-autotune"
    assert entry.key == {"triton_key": [98432, "torch.float32", "torch.float32"]}
    assert entry.best.meta == {"BLOCK_SIZE": 128} and entry.best.num_warps == 2
    first, _, failed = entry.measurements
    assert (first.median_ms, first.p20_ms, first.p80_ms) == (0.011, 0.010, 0.012)
    assert not failed.ok and math.isinf(failed.median_ms) and failed.error
    store = Store(tmp_path / "store", create=True)
    store.put_many(result.entries)
    assert store.lookup("add_kernel", entry.key, h200) == entry


def test_import_triton_distributed_cache(tmp_path, h200):
    folder = tmp_path / "autotune" / "ag_gemm"
    folder.mkdir(parents=True)
    record = {
        "config": [
            [
                0.91,
                {"gemm_config": {"__triton_config__": _triton_config(128, 8, 4)}, "straggler": 0},
            ],
            [
                0.73,
                {"gemm_config": {"__triton_config__": _triton_config(256, 8, 3)}, "straggler": 1},
            ],
        ],
        "deps": {"torch.version": "2.6.0", "triton.version": "3.3.0", "triton.hash": "abc"},
        "key": [[[4096, 8192], [8192, 1], {"__torch_dtype__": "torch.bfloat16"}], 8, 8],
        "func": "ag_gemm",
        "timestamp": "2025-09-01_10_00_00",
    }
    (folder / "0123abcd.json").write_text(json.dumps(record))
    (folder / "0123abcd.2025-08-01_10-00-00").write_text("{}")  # a backup it keeps: ignored
    (folder / "bad.json").write_text(json.dumps({"config": [[1.0, {"x": [1, 2]}]], "key": 1}))
    result = import_triton_dist(tmp_path / "autotune", h200)
    assert len(result.entries) == 1 and len(result.errors) == 1
    entry = result.entries[0]
    assert entry.source == "triton-dist" and entry.kernel == "ag_gemm"
    assert entry.key["triton_dist_key"][0][2] == "torch.bfloat16"
    assert entry.best.meta == {"BLOCK_SIZE": 256, "straggler": 1} and entry.best.num_stages == 3
    assert entry.fingerprint.software.torch == "2.6.0"
    assert entry.fingerprint.software.triton == "3.3.0"
    assert entry.fingerprint.hardware == h200.hardware


def test_import_of_an_empty_folder_gives_nothing(tmp_path, h200):
    result = import_triton_autotune(tmp_path, h200)
    assert result.entries == [] and result.errors == []


def _autotune(folder, name, configs=1):
    folder.mkdir(parents=True, exist_ok=True)
    timings = [[_triton_config(16 * (i + 1)), [0.5, 0.4, 0.6]] for i in range(configs)]
    path = folder / f"{name}.autotune.json"
    path.write_text(json.dumps({"key": [1], "configs_timings": timings}))
    return path


def test_a_huge_sparse_file_is_skipped_unread_and_the_others_import(tmp_path, h200):
    good = _autotune(tmp_path / "cache" / "A", "good")
    sparse = tmp_path / "cache" / "B" / "sparse.autotune.json"
    sparse.parent.mkdir()
    with sparse.open("wb") as f:
        f.truncate(2 * 2**30)  # 2 GiB, no block written
    tracemalloc.start()
    try:
        result = import_triton_autotune(tmp_path / "cache", h200)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e.kernel for e in result.entries] == ["good"] and result.files == 1
    assert result.errors == [
        f"{sparse}: {sparse.name} is {2 * 2**30} bytes; limit {MAX_FILE_BYTES}"
    ]
    assert peak < 2**20 and good.exists()


def test_a_file_of_too_many_values_or_configs_is_refused_before_the_store_sees_it(tmp_path, h200):
    many = tmp_path / "c" / "A" / "many.autotune.json"
    many.parent.mkdir(parents=True)
    many.write_text(json.dumps({"key": [1], "configs_timings": [[{}, [1]]] * 40_000}))
    _autotune(tmp_path / "c" / "B", "big", configs=4_000)  # a valid file, an entry > 1 MiB
    _autotune(tmp_path / "c" / "C", "small")
    result = import_triton_autotune(tmp_path / "c", h200)
    assert [e.kernel for e in result.entries] == ["small"]
    many_error, big_error = result.errors
    assert "many.autotune.json" in many_error and f"limit {MAX_FILE_VALUES}" in many_error
    assert "big.autotune.json" in big_error
    assert f"the store's limit is {MAX_ENTRY_BYTES}" in big_error
    store = Store(tmp_path / "store", create=True)
    store.put_many(result.entries)
    assert len(store) == 1 and store.quarantined_files() == 0


def test_a_deep_nest_is_one_bad_file_not_a_failed_import(tmp_path, h200):
    _autotune(tmp_path / "c" / "A", "fine")
    (tmp_path / "c" / "B").mkdir()
    (tmp_path / "c" / "B" / "deep.autotune.json").write_text("[" * 50_000 + "]" * 50_000)
    deep_key = {"key": [], "configs_timings": [[_triton_config(16), [1, 1, 1]]]}
    inner = deep_key["key"]
    for _ in range(900):  # parses, but is too deep for the entry's own code
        inner.append([])
        inner = inner[0]
    (tmp_path / "c" / "B" / "deepkey.autotune.json").write_text(json.dumps(deep_key))
    result = import_triton_autotune(tmp_path / "c", h200)
    assert [e.kernel for e in result.entries] == ["fine"] and len(result.errors) == 2
    assert all("deep" in error for error in result.errors)


def test_no_link_is_followed_out_of_the_folder(tmp_path, h200):
    outside = _autotune(tmp_path / "outside" / "X", "secret")
    dist_outside = tmp_path / "dist-outside"
    dist_outside.mkdir()
    (dist_outside / "0.json").write_text("{}")
    cache = tmp_path / "cache"
    _autotune(cache / "A", "mine")
    (cache / "A" / "secret.autotune.json").symlink_to(outside)
    (cache / "L").symlink_to(outside.parent, target_is_directory=True)
    result = import_triton_autotune(cache, h200)
    assert [e.kernel for e in result.entries] == ["mine"]
    assert sorted(result.errors) == [
        f"{cache / 'A' / 'secret.autotune.json'}: a link, not followed",
        f"{cache / 'L'}: a link to a folder, not followed",
    ]
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "fn").symlink_to(dist_outside, target_is_directory=True)
    assert import_triton_dist(dist, h200).errors == [
        f"{dist / 'fn'}: a link to a folder, not followed"
    ]
    found = import_triton_autotune_files([cache / "A" / "secret.autotune.json"], h200)
    assert found.entries == [] and "a link, not followed" in found.errors[0]


def test_an_import_holds_a_bounded_total(tmp_path, h200, monkeypatch):
    for name in ("a", "b", "c"):
        _autotune(tmp_path / "c" / name.upper(), name)
    (entry,) = import_triton_autotune_files(
        [tmp_path / "c" / "A" / "a.autotune.json"], h200
    ).entries
    monkeypatch.setattr(importers, "MAX_TOTAL_BYTES", 2 * len(atomic.dumps(entry.to_json())))
    result = import_triton_autotune(tmp_path / "c", h200)
    assert [e.kernel for e in result.entries] == ["a", "b"]
    assert len(result.errors) == 1 and "import the rest apart" in result.errors[0]
