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

from kernels import cublas_heuristics, startup
from kernels.adapter import GEMM_KEY, KernelAdapter, LaunchPlan, Layer, torch_dtype
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
    reserve_workspace,
)
from kernels.served import ServedLayer
from registry.core.config import KernelConfig

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


class AgGemmAdapter(KernelAdapter):
    """The fused AllGather-GEMM, as ``warmup/`` drives it (:class:`kernels.adapter.Adapter`)."""

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

    def serve(self, layer: Layer, *, group: Any, device: Any) -> AgGemmServed:
        return AgGemmServed(layer, group=group, device=device)

    def reserve(self, layers: Sequence[Layer], *, group: Any, device: Any) -> None:
        """The process's workspace of ``group`` sized once for the largest of ``layers``
        (a collective the first time; nothing once one holds them), so that layers made
        in any order share it with no rendezvous of their own."""
        if layers:
            reserve_workspace(
                group,
                nbytes=max(
                    layer.max_m * layer.k * torch_dtype(layer.dtype).itemsize for layer in layers
                ),
                device=device,
            )


# the best algorithm and tiles change with the number of ranks
ADAPTER = AgGemmAdapter(NAME, kernel_hash, key_fields=(*GEMM_KEY, "world"))


class AgGemmServed(ServedLayer):
    """One tensor-parallel layer, served: a context for (group, K, dtype, max M) over the
    process's workspace of that group (shared by its layers), calls with any config.
    See :class:`kernels.adapter.Served`."""

    adapter = ADAPTER
    kernel = NAME

    def __init__(self, layer: Layer, *, group: Any, device: Any) -> None:
        dtype = torch_dtype(layer.dtype)
        # the process's one workspace of this group: no rendezvous once it holds the rows
        ctx = create_context(
            group, max_m=layer.max_m, k=layer.k, dtype=dtype, device=device, shared=True
        )
        self._use(layer, ctx)

    @classmethod
    def over(cls, layer: Layer, ctx: AgGemmContext) -> AgGemmServed:
        """``layer`` served over a context made already for it (``__init__`` makes its
        own: a collective)."""
        served = cls.__new__(cls)
        served._use(layer, ctx)
        return served

    def _use(self, layer: Layer, ctx: AgGemmContext) -> None:
        super().__init__(layer, device=ctx.device)
        self.ctx, self.group, self.world = ctx, ctx.group, ctx.world
        self.rows_step = ctx.world
        self.collective = ctx.world > 1  # ranks must change algorithms together
        self._chosen: dict[bool, set[int]] = {False: set(), True: set()}  # cuBLAS shapes run

    def __call__(
        self, config: KernelConfig, a_shard: torch.Tensor, b: torch.Tensor, out: Any = None
    ) -> torch.Tensor:
        if b.shape[-1] != self.layer.n:  # K, dtype and device: checked by ag_gemm
            raise ValueError(
                f"ag_gemm: b is {list(b.shape)}; this layer's is [{self.layer.k}, {self.layer.n}]."
            )
        return ag_gemm(a_shard, b, self.ctx, config, out=out)

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
            with startup.phase("prime.gemms"):
                self._choose_gemms(config, rows)
            if algorithm_of(config) != BASELINE and self.ctx.world > 1:
                with startup.phase("prime.wait_kernel"):
                    prepare_wait(self.ctx)
        else:
            with startup.phase("prime.kernel"):
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
        startup.count("prime.gemm_shapes", len(gemms))
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

    def plan(
        self, g: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig
    ) -> LaunchPlan:
        return launch_plan(self.ctx, g, b, out, g.shape[0] // self.world, config)

    def default_config(self) -> KernelConfig:
        """The baseline: with no tuning to go by, never slower than what it replaces."""
        return BASELINE_CONFIG


def _random_inputs(m: int, n: int, k: int, ctx: AgGemmContext) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard and B for one shape: the same every time they are made."""
    generator = torch.Generator(device=ctx.device).manual_seed(m * 31 + n * 7 + k + ctx.rank)
    shard = torch.randn(m // ctx.world, k, generator=generator, device=ctx.device, dtype=ctx.dtype)
    b = torch.randn(k, n, generator=generator, device=ctx.device, dtype=ctx.dtype) / k**0.5
    return shard, b
