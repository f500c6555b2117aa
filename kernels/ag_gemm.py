"""Fused AllGather-GEMM for tensor parallelism: ``all_gather(a_shard) @ b`` on every rank.

Each rank holds ``a_shard: [M/world, K]`` and ``b: [K, N]`` (its column shard of a
weight). The gather hides behind the GEMM:

* A context (:mod:`kernels.ag_gemm_workspace`), made once per process group and maximum
  shape, owns the gathered buffer ``G: [max_M, K]`` and per-source ready flags, both
  writable by every peer, and a side stream.
* A call arms its flags, puts its own rows in G, meets the peers at a barrier; then the
  side stream pushes this rank's rows into every peer's G with the copy engine (no SMs),
  each followed by this rank's flag there. Nothing on the host changes from call to
  call, so calls repeat back to back and replay from a CUDA graph.
* The consumer GEMM walks its tiles starting at its own rows (ready at once) and makes
  every tile wait for the flags of the shards its rows come from.

Consumers: a persistent kernel with TMA tensor descriptors for Hopper (sm90+), and a
pointer-based kernel for other CUDA GPUs and for CPU under ``TRITON_INTERPRET=1``,
where memory-mapped files stand in for symmetric memory.

Layers, one module each: the ``@triton.jit`` code (:mod:`kernels.ag_gemm_kernels`), the
workspace and its protocol (:mod:`kernels.ag_gemm_workspace`), the launcher that checks
its inputs and runs a config's algorithm (:mod:`kernels.ag_gemm_launch`), what the tuner
needs (:mod:`kernels.ag_gemm_tuning`); here the served layer and the adapter, and the
public names of every layer, which callers import from here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from kernels import ag_gemm_workspace as workspace
from kernels import cublas_heuristics
from kernels.adapter import LaunchPlan, Layer, gemm_flops, torch_dtype
from kernels.ag_gemm_kernels import M_DERIVED
from kernels.ag_gemm_launch import (
    ALGORITHMS,
    ALL_GATHER,
    BASELINE,
    BASELINE_CONFIG,
    FUSED,
    GATHER_FIRST,
    HOPPER_META,
    LIBRARY,
    OVERLAP,
    ag_gemm,
    algorithm_of,
    baseline_buffer,
    check_inputs,
    launch_plan,
    prepare_wait,
    run_for,
)
from kernels.ag_gemm_tuning import (
    NAME,
    AgGemmTask,
    candidates,
    kernel_hash,
    key,
    library_configs,
    problem,
    reference,
    space,
    torch_fused,
)
from kernels.ag_gemm_workspace import (
    AgGemmContext,
    create_context,
    group_size_and_rank,
    input_buffer,
)
from kernels.shapes import RULES
from registry import KernelConfig

__all__ = [
    "ADAPTER",
    "ALGORITHMS",
    "ALL_GATHER",
    "BASELINE",
    "BASELINE_CONFIG",
    "FUSED",
    "GATHER_FIRST",
    "HOPPER_META",
    "LIBRARY",
    "M_DERIVED",
    "NAME",
    "OVERLAP",
    "AgGemmAdapter",
    "AgGemmContext",
    "AgGemmServed",
    "AgGemmTask",
    "ag_gemm",
    "algorithm_of",
    "candidates",
    "check_inputs",
    "create_context",
    "group_size_and_rank",
    "input_buffer",
    "kernel_hash",
    "key",
    "launch_plan",
    "library_configs",
    "prepare_wait",
    "problem",
    "reference",
    "space",
    "torch_fused",
]


class AgGemmServed:
    """One tensor-parallel layer, served: a context for (group, K, dtype, max M), calls
    with any config. See :class:`kernels.adapter.Served`."""

    kernel = NAME

    def __init__(self, layer: Layer, *, group: Any, device: Any) -> None:
        self.layer = layer
        self.ctx = create_context(
            group, max_m=layer.max_m, k=layer.k, dtype=torch_dtype(layer.dtype), device=device
        )
        self.rows_step, self.device = self.ctx.world, self.ctx.device
        self.collective = self.ctx.world > 1  # ranks must change algorithms together
        self._chosen: dict[bool, set[int]] = {False: set(), True: set()}  # cuBLAS shapes run

    @property
    def group(self) -> Any:
        return self.ctx.group

    def key(self, m: int) -> dict[str, Any]:
        return ADAPTER.key(
            m=m, n=self.layer.n, k=self.layer.k, dtype=self.layer.dtype, world=self.ctx.world
        )

    def rows(self, a_shard: torch.Tensor, b: torch.Tensor) -> int:
        return int(a_shard.shape[0]) * self.rows_step

    def __call__(
        self, config: KernelConfig, a_shard: torch.Tensor, b: torch.Tensor, out: Any = None
    ) -> torch.Tensor:
        if b.shape[-1] != self.layer.n:  # K, dtype and device: checked by ag_gemm
            raise ValueError(
                f"ag_gemm: b is {list(b.shape)}; this layer's is [{self.layer.k}, {self.layer.n}]."
            )
        return ag_gemm(a_shard, b, self.ctx, config, out=out)

    def agree(self, value: Any) -> Any:
        return workspace.agree(self.ctx, value)

    def all_true(self, flag: bool) -> bool:
        if self.ctx.world == 1:
            return flag
        device = self.ctx.device if dist.get_backend(self.ctx.group) == "nccl" else "cpu"
        votes = torch.tensor([int(flag)], dtype=torch.int32, device=device)
        dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=self.ctx.group)
        return bool(votes.item())

    def prepare(self, config: KernelConfig, rows: Sequence[int]) -> None:
        """The fused variant compiled or loaded once (one serves every M); for a library
        algorithm, one cuBLAS call at each shape its calls of ``rows`` will make: cuBLAS
        chooses and loads a kernel at the first call of each shape (0.2 ms at the median
        and 3.4 ms at p90 on an H200 at N 7168, K 4096, against 18 us after), which no
        request may pay."""
        run_for(config)  # an algorithm this version lacks fails here, not on a request
        if algorithm_of(config) == BASELINE and self.ctx.world > 1:
            baseline_buffer(self.ctx)
        if self.ctx.device.type != "cuda":
            return  # the interpreter compiles nothing
        if algorithm_of(config) != FUSED:
            self._choose_gemms(config, rows)
            if algorithm_of(config) != BASELINE and self.ctx.world > 1:
                prepare_wait(self.ctx)
        else:
            self.warm_up_plan(config).load()

    def _choose_gemms(self, config: KernelConfig, rows: Sequence[int]) -> None:
        """One GEMM per new shape of ``config``'s calls at ``rows``, on scratch memory and
        a stream of its own (off any request's way), waited for."""
        world = self.ctx.world
        per_shard = algorithm_of(config) == OVERLAP and world > 1  # one GEMM per shard
        shapes = sorted({m // world if per_shard else m for m in rows} - self._chosen[per_shard])
        if not shapes:
            return
        ctx, n = self.ctx, self.layer.n
        # a shard's GEMM also runs at an offset: both alignments
        gemms = [(m, at) for m in shapes for at in ((0, m) if per_shard else (0,))]
        cublas_heuristics.PROCESS.make_room(
            ((m, n, ctx.k, ctx.dtype, at > 0) for m, at in gemms),
            load=lambda: torch.ones(1, 1, dtype=ctx.dtype, device=ctx.device).mm(
                torch.ones(1, 1, dtype=ctx.dtype, device=ctx.device)
            ),
        )
        stream = torch.cuda.Stream(device=ctx.device)  # type: ignore[no-untyped-call]
        rows_needed = shapes[-1] * (2 if per_shard else 1)
        with torch.cuda.stream(stream):
            a = torch.zeros(rows_needed, ctx.k, dtype=ctx.dtype, device=ctx.device)
            b = torch.zeros(ctx.k, n, dtype=ctx.dtype, device=ctx.device)
            out = torch.empty(rows_needed, n, dtype=ctx.dtype, device=ctx.device)
            for m, at in gemms:
                torch.matmul(a[at : at + m], b, out=out[at : at + m])
        stream.synchronize()
        self._chosen[per_shard].update(shapes)

    def warm_up_plan(self, config: KernelConfig) -> LaunchPlan:
        """A launch plan on meta tensors: the specialisation of an aligned real call, no
        memory, nothing launched."""
        world, n, k, dtype = self.ctx.world, self.layer.n, self.layer.k, self.ctx.dtype
        g, b, out = (
            torch.empty(*shape, dtype=dtype, device="meta")
            for shape in ((world, k), (k, n), (world, n))
        )
        return launch_plan(self.ctx, g, b, out, 1, config)

    def rehearse(self, configs: Sequence[KernelConfig]) -> None:
        ctx, layer = self.ctx, self.layer
        shard = torch.randn(1, layer.k, dtype=ctx.dtype, device=ctx.device)
        b = torch.randn(layer.k, layer.n, dtype=ctx.dtype, device=ctx.device)  # freed on return
        for config in configs:
            ag_gemm(shard, b, ctx, config)
        if ctx.device.type == "cuda":
            torch.cuda.current_stream(ctx.device).synchronize()

    def default_config(self) -> KernelConfig:
        """The baseline: with no tuning to go by, never slower than what it replaces."""
        return BASELINE_CONFIG


class AgGemmAdapter:
    """The fused AllGather-GEMM, as ``warmup/`` drives it (:class:`kernels.adapter.Adapter`)."""

    name = NAME

    def kernel_hash(self) -> str:
        return kernel_hash()

    def check_shape(self, shape: Mapping[str, int], *, world_size: int) -> str | None:
        """The rule :mod:`kernels.shapes` holds for this kernel (read there without torch)."""
        return RULES[NAME].check(shape, world_size=world_size)

    def key(self, *, m: int, n: int, k: int, dtype: str, world: int) -> dict[str, Any]:
        return {"M": m, "N": n, "K": k, "dtype": dtype, "world": world}

    def tasks(
        self, shapes: Sequence[Mapping[str, int]], *, dtype: str, group: Any, device: Any
    ) -> Iterator[AgGemmTask]:
        """Random inputs per shape; one workspace per K, sized for that K's largest M."""
        contexts: dict[int, AgGemmContext] = {}
        for shape in shapes:
            m, n, k = shape["M"], shape["N"], shape["K"]
            if k not in contexts:  # made in the same order on every rank: a collective
                max_m = max(s["M"] for s in shapes if s["K"] == k)
                contexts[k] = create_context(
                    group, max_m=max_m, k=k, dtype=torch_dtype(dtype), device=device
                )
            inputs = functools.partial(_random_inputs, m, n, k, contexts[k])
            yield AgGemmTask(*inputs(), contexts[k], inputs=inputs)

    def tuning_cost(self, shape: Mapping[str, int]) -> float:
        return gemm_flops(shape)

    def serve(self, layer: Layer, *, group: Any, device: Any) -> AgGemmServed:
        return AgGemmServed(layer, group=group, device=device)


def _random_inputs(m: int, n: int, k: int, ctx: AgGemmContext) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard and B for one shape: the same every time they are made."""
    generator = torch.Generator(device=ctx.device).manual_seed(m * 31 + n * 7 + k + ctx.rank)
    shard = torch.randn(m // ctx.world, k, generator=generator, device=ctx.device, dtype=ctx.dtype)
    b = torch.randn(k, n, generator=generator, device=ctx.device, dtype=ctx.dtype) / k**0.5
    return shard, b


ADAPTER = AgGemmAdapter()
