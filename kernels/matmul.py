"""A tiled Triton matmul: the demo's kernel and the tuner's benchmark subject.

On CPU tensors it runs under Triton's interpreter, which needs TRITON_INTERPRET=1 in
the environment before this module is imported (the launcher sets it for CPU ranks).

Layers: the ``@triton.jit`` kernel, the launcher that checks arguments and takes a
config, then what a tuner needs (key, space, reference, ahead-of-time compile).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.adapter import KernelAdapter, LaunchPlan, Layer, dtype_name, torch_dtype
from kernels.served import ServedLayer
from kernels.task import ProductTask
from registry.core.config import KernelConfig
from registry.core.fingerprint import kernel_source_hash
from registry.core.triton_internals import compile_for

NAME = "matmul"


@triton.jit(do_not_specialize=["M"])  # type: ignore[untyped-decorator]  # batch sizes vary per call: one kernel serves them all
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)  # grouped order: neighbours share B tiles in L2
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        ks = k * BLOCK_K + offs_k
        a = tl.load(
            a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=(offs_m[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
            mask=(ks[:, None] < K) & (offs_n[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    c = acc.to(c_ptr.dtype.element_ty)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c, mask=mask)


def matmul(
    a: torch.Tensor, b: torch.Tensor, config: KernelConfig, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``a @ b`` with the given config. a: [M, K], b: [K, N] -> [M, N]."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not chain.")
    if a.dtype != b.dtype or dtype_name(a.dtype) is None:
        raise ValueError(f"matmul: dtypes {a.dtype}, {b.dtype}; need one of fp16/bf16/fp32.")
    if a.device != b.device:
        raise ValueError(f"matmul: a on {a.device}, b on {b.device}.")
    m, n = a.shape[0], b.shape[1]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device) if out is None else out
    launch_plan(a, b, out, config).launch()
    return out


def launch_plan(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig
) -> LaunchPlan:
    """What :func:`matmul` launches; M is an unspecialised integer."""
    (m, k), n = a.shape, b.shape[1]
    meta = config.meta
    grid = (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    args = (a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride())
    return LaunchPlan(_matmul_kernel, grid, args, config.all_kwargs())


def key(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    """What a tuned config depends on: the problem size and the dtype."""
    return {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1], "dtype": dtype_name(a.dtype)}


def space(
    block_m: tuple[int, ...] = (64, 128),
    block_n: tuple[int, ...] = (128, 256),
    block_k: tuple[int, ...] = (32, 64),
    stages_warps: tuple[tuple[int, int], ...] = ((3, 8), (4, 4)),
    group_m: int = 8,
) -> list[KernelConfig]:
    """The config space; the defaults are the 16 configs of the tuning-cost benchmark."""
    return [
        KernelConfig.make(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
            num_stages=s,
            num_warps=w,
        )
        for bm in block_m
        for bn in block_n
        for bk in block_k
        for s, w in stages_warps
    ]


@dataclass
class MatmulTask(ProductTask):
    """One matmul problem, as the tuner sees it (:class:`kernels.task.TuneTask`)."""

    a: torch.Tensor
    b: torch.Tensor
    configs: list[KernelConfig] = field(default_factory=space)
    # makes (a, b) again after drop_inputs(); None: the caller's inputs, never dropped
    inputs: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    kernel: str = NAME
    out: torch.Tensor | None = None
    _expected: torch.Tensor | None = None

    @property
    def kernel_hash(self) -> str:
        return kernel_hash()

    def key(self) -> dict[str, Any]:
        return key(self.a, self.b)

    def candidates(self) -> list[KernelConfig]:
        return list(self.configs)

    def run(self, config: KernelConfig) -> torch.Tensor:
        if self.out is None:
            self.out = torch.empty(
                self.a.shape[0], self.b.shape[1], dtype=self.a.dtype, device=self.a.device
            )
        return matmul(self.a, self.b, config, out=self.out)

    def reference(self) -> torch.Tensor:
        """The product in float64 on the CPU, in float32 on a GPU."""
        if self.a.device.type == "cpu":
            return self.a.double() @ self.b.double()
        return self.a.float() @ self.b.float()

    def warmup(self, config: KernelConfig) -> None:
        if self.a.device.type == "cuda":
            out = (
                torch.empty(
                    self.a.shape[0], self.b.shape[1], dtype=self.a.dtype, device=self.a.device
                )
                if self.out is None
                else self.out
            )
            launch_plan(self.a, self.b, out, config).compile()


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The float64 product, to check a config's output against."""
    return (a.double() @ b.double()).to(a.dtype)


def compile_ahead(config: KernelConfig, dtype: str, target: Any) -> Any:
    """Compile one config for ``target`` (e.g. ``GPUTarget("cuda", 90, 32)``), no GPU needed;
    the artifacts land in TRITON_CACHE_DIR."""
    pointer = f"*{dtype}"
    signature = {
        "a_ptr": pointer,
        "b_ptr": pointer,
        "c_ptr": pointer,
        **{
            n: "i32"
            for n in (
                "M",
                "N",
                "K",
                "stride_am",
                "stride_ak",
                "stride_bk",
                "stride_bn",
                "stride_cm",
                "stride_cn",
            )
        },
        **{n: "constexpr" for n in config.meta},
    }
    launch = {k: v for k, v in config.all_kwargs().items() if k not in config.meta}
    return compile_for(
        _matmul_kernel, signature=signature, constexprs=config.meta, target=target, options=launch
    )


def kernel_hash() -> str:
    """The public hash of the kernel's source (part of every fingerprint)."""
    return kernel_source_hash(_matmul_kernel)


class MatmulAdapter(KernelAdapter):
    """The tiled matmul, as ``warmup/`` drives it (:class:`kernels.adapter.Adapter`)."""

    def tasks(
        self, shapes: Sequence[Mapping[str, int]], *, dtype: str, group: Any, device: Any
    ) -> Iterator[MatmulTask]:
        element = torch_dtype(dtype)
        for shape in shapes:
            m, n, k = shape["M"], shape["N"], shape["K"]
            inputs = functools.partial(_random_inputs, m, n, k, element, device)
            yield MatmulTask(*inputs(), inputs=inputs)

    def serve(self, layer: Layer, *, group: Any, device: Any) -> MatmulServed:
        return MatmulServed(layer, device=device)


ADAPTER = MatmulAdapter(NAME, kernel_hash)


class MatmulServed(ServedLayer):
    """One layer ``x @ w`` served on one device (:class:`kernels.adapter.Served`)."""

    adapter = ADAPTER
    kernel = NAME

    def __call__(
        self, config: KernelConfig, a: torch.Tensor, b: torch.Tensor, out: Any = None
    ) -> torch.Tensor:
        if a.shape[0] > self.layer.max_m or tuple(b.shape) != (self.layer.k, self.layer.n):
            raise ValueError(
                f"matmul: a {tuple(a.shape)}, b {tuple(b.shape)}; the layer takes at most "
                f"{self.layer.max_m} rows and b [{self.layer.k}, {self.layer.n}]."
            )
        if a.dtype != self.dtype or a.device != self.device:
            raise ValueError(
                f"matmul: a is {a.dtype} on {a.device}; the layer is {self.dtype} on {self.device}."
            )
        return matmul(a, b, config, out=out)

    def plan(
        self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig
    ) -> LaunchPlan:
        return launch_plan(a, b, out, config)

    def default_config(self) -> KernelConfig:
        return space()[0]


def _random_inputs(
    m: int, n: int, k: int, dtype: torch.dtype, device: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B for one shape: the same every time they are made."""
    generator = torch.Generator(device=device).manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k, generator=generator, device=device, dtype=dtype)
    b = torch.randn(k, n, generator=generator, device=device, dtype=dtype) / k**0.5
    return a, b
