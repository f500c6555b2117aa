import json
import math

from registry import Store
from registry.importers import import_triton_autotune, import_triton_dist


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
    store = Store(tmp_path / "store")
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
