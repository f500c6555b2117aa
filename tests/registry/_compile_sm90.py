"""Compile a small kernel for sm90 in a fresh process (no GPU needed) and report whether
Triton's own cache lookup hit: a hit writes nothing into TRITON_CACHE_DIR."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3, mask=mask)


def snapshot(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def main() -> None:
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    before = snapshot(cache) if cache.exists() else {}
    src = ASTSource(
        fn=scale_kernel,
        signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 256},
    )
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    after = snapshot(cache)
    written = sorted(p for p, t in after.items() if before.get(p) != t)
    paths = list(kernel.metadata_group.values())
    print(
        json.dumps(
            {
                "hit": not written,
                "written": written,
                "hash": kernel.hash,
                "in_cache": all(p.startswith(str(cache)) for p in paths),
                "cubin": len(kernel.asm["cubin"]),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
