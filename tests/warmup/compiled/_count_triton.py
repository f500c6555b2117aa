"""``python -m tests.warmup.compiled._count_triton``: compile the sm90 kernel of
``tests.registry._compile_sm90`` twice (a miss, then Triton's disk cache) and print
what :mod:`warmup.compiled.counters` counted each time (no GPU needed)."""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tests.registry._compile_sm90 import scale_kernel
from warmup.compiled.counters import snapshot


def compile_once() -> int:
    before = snapshot()
    src = ASTSource(
        fn=scale_kernel,
        signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 256},
    )
    triton.compile(src, target=GPUTarget("cuda", 90, 32))
    return (snapshot() - before).kernel_compiles


if __name__ == "__main__":
    print(json.dumps([compile_once(), compile_once()]))
