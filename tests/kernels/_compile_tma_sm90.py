"""Compile the Hopper AllGather-GEMM consumer for sm90 without a GPU; print what the PTX
holds of the synchronisation the design relies on."""

from __future__ import annotations

import json

from kernels import ag_gemm_kernels
from registry.core import triton_internals

BM, BN, BK = 128, 256, 64
SIGNATURE = {
    "g_desc": f"tensordesc<bf16[{BM},{BK}]>",
    "b_desc": f"tensordesc<bf16[{BK},{BN}]>",
    "c_desc": f"tensordesc<bf16[{BM},{BN}]>",
    "flags_ptr": "*i32",
    **{name: "i32" for name in ("M", "N", "K", "m_per_rank", "rank")},
    **{
        name: "constexpr"
        for name in (
            "WORLD",
            "NUM_SMS",
            "BLOCK_M",
            "BLOCK_N",
            "BLOCK_K",
            "GROUP_M",
            "EPILOGUE_SUBTILE",
        )
    },
}
CONSTANTS = {"WORLD": 4, "NUM_SMS": 132, "BLOCK_M": BM, "BLOCK_N": BN, "BLOCK_K": BK, "GROUP_M": 8}
CONSTANTS |= {"EPILOGUE_SUBTILE": 1}


def compiled(subtile: int) -> dict[str, object]:
    signature = {**SIGNATURE, "c_desc": f"tensordesc<bf16[{BM},{BN // subtile}]>"}
    kernel = triton_internals.compile_for(
        ag_gemm_kernels._ag_gemm_tma_kernel,
        signature=signature,
        constexprs={**CONSTANTS, "EPILOGUE_SUBTILE": subtile},
        target=triton_internals.gpu_target(90),
        options={"num_warps": 8, "num_stages": 3},
    )
    ptx = kernel.asm["ptx"]
    return {
        "acquire_loads": ptx.count("ld.global.sys.acquire"),
        "async_proxy_fence": "fence.proxy.async.global" in ptx,
        "wgmma": "wgmma.mma_async" in ptx,
        "tma_loads": "cp.async.bulk.tensor" in ptx,
        "tma_stores": ptx.count("cp.async.bulk.tensor.2d.global.shared"),
        "shared": kernel.metadata.shared,
    }


if __name__ == "__main__":
    print(json.dumps({"whole": compiled(1), "halves": compiled(2)}))
