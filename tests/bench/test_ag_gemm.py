"""The AllGather-GEMM bench's shapes from a manifest: every ag_gemm shape it declares,
once, in its order, at this run's world size; refused by name when they cannot run."""

from pathlib import Path

import pytest

from bench.ag_gemm import manifest_shapes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-tp8.yaml"


def test_the_example_manifests_shapes_in_order_each_once_its_user_kernel_left_out():
    shapes = manifest_shapes(EXAMPLE, 8)
    decode = [(m, 3584, 8192) for m in (8, 16, 32, 64, 128, 256, 512)]
    prefill = [(4096, 3584, 8192), (8192, 3584, 8192), (16384, 3584, 8192)]
    assert shapes == [*prefill, *decode, (4096, 7168, 8192), (8192, 7168, 8192)]
    assert manifest_shapes(EXAMPLE, 2) == shapes  # the entries' world size is not this run's


def _manifest(tmp_path: Path, entries: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"version: 1\nentries:\n{entries}")
    return path


def test_a_shape_declared_twice_is_timed_once(tmp_path):
    entry = (
        "  - {{kernel: ag_gemm, dtype: bf16, world_size: {w}, shapes: [{{M: 64, N: 32, K: 16}}]}}\n"
    )
    path = _manifest(tmp_path, entry.format(w=2) + entry.format(w=4))
    assert manifest_shapes(path, 4) == [(64, 32, 16)]


def test_rows_the_ranks_cannot_split_are_named(tmp_path):
    with pytest.raises(SystemExit, match=r"M \[8\] not a multiple of 16 ranks"):
        manifest_shapes(EXAMPLE, 16)


def test_a_manifest_without_the_kernel_of_another_dtype_invalid_or_missing_is_refused(tmp_path):
    other = _manifest(
        tmp_path,
        "  - {kernel: matmul, dtype: bf16, world_size: 1, shapes: [{M: 64, N: 32, K: 16}]}\n",
    )
    with pytest.raises(SystemExit, match="no ag_gemm entry"):
        manifest_shapes(other, 2)
    fp16 = _manifest(
        tmp_path,
        "  - {kernel: ag_gemm, dtype: fp16, world_size: 2, shapes: [{M: 64, N: 32, K: 16}]}\n",
    )
    with pytest.raises(SystemExit, match=r"\['fp16'\] entries; the bench times bf16 alone"):
        manifest_shapes(fp16, 2)
    with pytest.raises(SystemExit, match=r"(?s)--manifest: .*m.yaml .*world_size: Field required"):
        manifest_shapes(_manifest(tmp_path, "  - {kernel: ag_gemm, dtype: bf16}\n"), 2)
    with pytest.raises(SystemExit, match=r"(?s)--manifest: .*absent.yaml .*cannot read"):
        manifest_shapes(tmp_path / "absent.yaml", 2)
