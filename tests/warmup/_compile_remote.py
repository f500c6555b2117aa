"""Compile ``tests.registry._compile_sm90.scale_kernel`` for sm90 (no GPU needed) at the
BLOCK of argv[1], in a fresh process whose Triton cache manager the caller's env names,
and print whether Triton's cache lookup hit, with this process's remote cache counts."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Any

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tests.registry._compile_sm90 import scale_kernel


def main() -> None:
    hits: list[bool] = []

    def listener(**event: Any) -> None:
        hits.append(bool(event["cache_hit"]))

    knobs.compilation.listener = listener
    src = ASTSource(
        fn=scale_kernel,
        signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": int(sys.argv[1])},
    )
    start = time.perf_counter()
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    seconds = time.perf_counter() - start
    from warmup import triton_remote_cache

    out = {"hit": hits == [True], "seconds": seconds, "cubin": len(kernel.asm["cubin"])}
    print(json.dumps({**out, "remote": asdict(triton_remote_cache.stats)}))


if __name__ == "__main__":
    main()
