"""What the tuner needs of the AllGather-GEMM (see :mod:`kernels.ag_gemm`): its tune
task, key, config space and candidates, its reference, and its public kernel hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from kernels.adapter import dtype_name
from kernels.ag_gemm_kernels import _ag_gemm_portable_kernel, _ag_gemm_tma_kernel
from kernels.ag_gemm_launch import (
    ALGORITHMS,
    ALL_GATHER,
    BASELINE,
    BASELINE_CONFIG,
    FUSED,
    LIBRARY,
    ag_gemm,
    algorithm_of,
    check_inputs,
    launch_plan,
    prepare_wait,
)
from kernels.ag_gemm_workspace import AgGemmContext, group_size_and_rank
from kernels.spaces import Problem, ag_gemm_space, ordered, prune
from kernels.task import ProductTask
from registry.core.config import KernelConfig
from registry.core.fingerprint import kernel_source_hash

NAME = "ag_gemm"  # the kernel: in kernels.ADAPTERS, the registry's entries, the shape rules


@dataclass
class AgGemmTask(ProductTask):
    """One AllGather-GEMM problem, as the tuner sees it (:class:`kernels.task.TuneTask`):
    ``a`` is this rank's shard of the rows. Every rank builds the same task; the tuner
    runs them in lockstep. Its reference gathers: a collective, made with the inputs."""

    a: torch.Tensor
    b: torch.Tensor
    ctx: AgGemmContext
    configs: list[KernelConfig] | None = None  # default: the pruned, model-ordered space
    # makes (a, b) again after drop_inputs(); None: the caller's inputs, never dropped
    inputs: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    kernel: str = NAME
    out: torch.Tensor | None = None
    _expected: torch.Tensor | None = None
    collective_reference = True

    def __post_init__(self) -> None:
        self._expected = self.reference()

    def reference(self) -> torch.Tensor:
        """NCCL + cuBLAS in the input dtype on GPUs (cheap on the start-up path); float64
        on the CPU."""
        if self.a.device.type == "cpu":
            return reference(self.a.double(), self.b.double(), self.ctx.group)
        return reference(self.a, self.b, self.ctx.group)

    @property
    def kernel_hash(self) -> str:
        return kernel_hash()

    def key(self) -> dict[str, Any]:
        return key(self.a, self.b, self.ctx)

    def candidates(self) -> list[KernelConfig]:
        """The baseline first (the policy 'fallback' takes the first), the other library
        algorithms, then the fused space, pruned and ordered by the model."""
        if self.configs is not None:
            return list(self.configs)
        return candidates(self.ctx, problem(self.a, self.b, self.ctx))

    def baseline(self) -> KernelConfig:
        """NCCL + cuBLAS: the tuner stores another algorithm only if it beats this one
        beyond noise."""
        return BASELINE_CONFIG

    def run(self, config: KernelConfig) -> torch.Tensor:
        if self.out is None:
            m, n = self.a.shape[0] * self.ctx.world, self.b.shape[1]
            self.out = torch.empty(m, n, dtype=self.ctx.dtype, device=self.ctx.device)
        return ag_gemm(self.a, self.b, self.ctx, config, out=self.out)

    def warmup(self, config: KernelConfig) -> None:
        if self.ctx.device.type != "cuda" or algorithm_of(config) == BASELINE:
            return  # the interpreter compiles nothing; the baseline compiles nothing
        if algorithm_of(config) != FUSED:
            prepare_wait(self.ctx)
            return
        m, n, _ = check_inputs(self.a, self.b, self.ctx)
        g = self.a if self.ctx.world == 1 else self.ctx.buffer[:m]
        out = (
            torch.empty(m, n, dtype=self.ctx.dtype, device=self.ctx.device)
            if self.out is None
            else self.out
        )
        launch_plan(self.ctx, g, self.b, out, self.a.shape[0], config).compile()


def key(a_shard: torch.Tensor, b: torch.Tensor, ctx: AgGemmContext) -> dict[str, Any]:
    """What a tuned config depends on: gathered M, per-rank N, K, dtype, ranks."""
    return {
        "M": a_shard.shape[0] * ctx.world,
        "N": b.shape[1],
        "K": a_shard.shape[1],
        "dtype": dtype_name(a_shard.dtype),
        "world": ctx.world,
    }


def problem(a_shard: torch.Tensor, b: torch.Tensor, ctx: AgGemmContext) -> Problem:
    return Problem(
        m=a_shard.shape[0] * ctx.world,
        n=b.shape[1],
        k=a_shard.shape[1],
        world=ctx.world,
        element_bytes=a_shard.element_size(),
    )


def space(ctx: AgGemmContext) -> list[KernelConfig]:
    """The fused algorithm's config space for the context's device (see
    :mod:`kernels.spaces`); the library algorithms have no parameters."""
    return [replace(c, algorithm=FUSED) for c in ag_gemm_space(ctx.limits)]


def library_configs(ctx: AgGemmContext) -> list[KernelConfig]:
    """One config per library algorithm; on one rank there is nothing to gather, and the
    baseline alone (a plain GEMM) stands for them."""
    names = LIBRARY if ctx.world > 1 else (BASELINE,)
    return [KernelConfig.make(algorithm=name) for name in names]


def candidates(ctx: AgGemmContext, problem_: Problem) -> list[KernelConfig]:
    """Every algorithm's configs for one problem: the library ones (the baseline first),
    then the fused space, pruned and ordered by the performance model."""
    fused = prune(space(ctx), problem_, ctx.limits).kept
    return library_configs(ctx) + ordered(fused, problem_, ctx.limits)


def reference(a_shard: torch.Tensor, b: torch.Tensor, group: Any = None) -> torch.Tensor:
    """NCCL (or gloo) ``all_gather_into_tensor`` then ``torch.matmul`` (cuBLAS on GPU)."""
    world, _ = group_size_and_rank(group)
    if world == 1:
        return torch.matmul(a_shard, b)
    gathered = a_shard.new_empty(a_shard.shape[0] * world, a_shard.shape[1])
    ALL_GATHER(gathered, a_shard, group=group)
    return torch.matmul(gathered, b)


def torch_fused(a_shard: torch.Tensor, b: torch.Tensor, group: Any) -> torch.Tensor | None:
    """torch's ``symm_mem.fused_all_gather_matmul`` where this torch has it, else None."""
    op = getattr(getattr(torch.ops, "symm_mem", None), "fused_all_gather_matmul", None)
    if op is None or a_shard.device.type != "cuda":
        return None
    _, outputs = op(a_shard, [b], gather_dim=0, group_name=group.group_name)
    return outputs[0]  # type: ignore[no-any-return]


def kernel_hash() -> str:
    """The public hash of both consumers' sources and of the algorithms a config may
    choose (part of every fingerprint): a version that adds an algorithm tunes again
    rather than keep a winner chosen without it."""
    tma = kernel_source_hash(_ag_gemm_tma_kernel)
    algorithms = hashlib.sha256(",".join(ALGORITHMS).encode()).hexdigest()[:8]
    return f"{tma}{kernel_source_hash(_ag_gemm_portable_kernel)[:16]}-{algorithms}"
