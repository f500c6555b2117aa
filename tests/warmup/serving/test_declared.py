"""The layers a manifest declares for a kernel at a world size."""

from __future__ import annotations

from kernels.adapter import Layer
from warmup.core.manifest import parse_manifest
from warmup.serving.declared import declared_layers

MANIFEST = """version: 1
entries:
  - {kernel: ag_gemm, dtype: fp16, world_size: 2, shapes: [{M: [16, 256], N: 64, K: 32}]}
  - {kernel: ag_gemm, dtype: fp16, world_size: 2, shapes: [{M: 512, N: 64, K: 32}]}
  - {kernel: ag_gemm, dtype: fp16, world_size: 2, shapes: [{M: 64, N: 16, K: 128}]}
  - {kernel: ag_gemm, dtype: fp16, world_size: 4, shapes: [{M: 4096, N: 64, K: 4096}]}
  - {kernel: matmul, dtype: fp16, world_size: 1, shapes: [{M: 4096, N: 64, K: 4096}]}
"""


def test_each_layer_of_the_kernel_at_the_world_size_once_at_its_largest_m():
    manifest = parse_manifest(MANIFEST)
    assert declared_layers(manifest, "ag_gemm", 2) == [
        Layer(64, 32, "fp16", 512),
        Layer(16, 128, "fp16", 64),
    ]
    assert declared_layers(manifest, "ag_gemm", 8) == []
    assert declared_layers(manifest, "matmul", 1) == [Layer(64, 4096, "fp16", 4096)]
