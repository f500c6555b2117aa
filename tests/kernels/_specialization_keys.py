"""Count the JIT variants that serving calls at every M would need, without a GPU.

Runs without TRITON_INTERPRET: builds each kernel's launch plan on CPU tensors for every
M up to a maximum and asks Triton's own binder, made for an sm90 target, for the
specialisation it would compile. Prints, per (kernel, consumer, world), the number of
distinct specialisations over M and whether the serving warm-up (meta tensors) hits one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from kernels import ag_gemm, matmul
from kernels.adapter import LaunchPlan, Layer
from kernels.spaces import DeviceLimits
from registry import KernelConfig
from registry.core import triton_internals

SM90 = triton_internals.gpu_target(90)
H100 = DeviceLimits("H100", 132, 227 * 1024, (9, 0), 790.0, 3350.0)
CONFIG = KernelConfig.make(
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=3
)
N, K = 96, 64


def key(plan: LaunchPlan) -> str:
    return triton_internals.bound_specialization(plan.kernel, plan.args, plan.options, SM90)


def context(world: int, consumer: str, max_m: int) -> ag_gemm.AgGemmContext:
    def buffer() -> torch.Tensor:
        return torch.empty(max_m, K, dtype=torch.bfloat16)

    return ag_gemm.AgGemmContext(
        group=None,
        rank=world - 1,
        world=world,
        max_m=max_m,
        k=K,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        limits=H100,
        buffer=buffer(),
        flags=torch.zeros(world, dtype=torch.int32),
        one=torch.ones(1, dtype=torch.int32),
        consumer=consumer,
    )


def ag_gemm_keys(world: int, consumer: str, max_m: int) -> dict[str, Any]:
    ctx = context(world, consumer, max_m)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    keys = set()
    for m in range(world, max_m + 1, world):
        g = torch.empty(m, K, dtype=torch.bfloat16) if world == 1 else ctx.buffer[:m]
        out = torch.empty(m, N, dtype=torch.bfloat16)
        keys.add(key(ag_gemm.launch_plan(ctx, g, b, out, m // world, CONFIG)))
    served = ag_gemm.AgGemmServed.over(Layer(N, K, "bf16", max_m), ctx)
    warm = key(served.warm_up_plan(CONFIG))
    return {"variants": len(keys), "warm_up_hits": warm in keys}


def matmul_keys(max_m: int) -> dict[str, Any]:
    b = torch.empty(K, N, dtype=torch.bfloat16)
    keys = set()
    for m in range(1, max_m + 1):
        a, out = torch.empty(m, K, dtype=torch.bfloat16), torch.empty(m, N, dtype=torch.bfloat16)
        keys.add(key(matmul.launch_plan(a, b, out, CONFIG)))
    served = matmul.MatmulServed(Layer(N, K, "bf16", max_m), device="cpu")
    warm = key(served.warm_up_plan(CONFIG))
    return {"variants": len(keys), "warm_up_hits": warm in keys}


if __name__ == "__main__":
    max_m = int(sys.argv[1])
    report = {
        f"ag_gemm/{consumer}/world{world}": ag_gemm_keys(world, consumer, max_m - max_m % world)
        for consumer in ("tma", "portable")
        for world in (1, 2, 3)
    }
    report["matmul"] = matmul_keys(max_m)
    print(json.dumps(report))
