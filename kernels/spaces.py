"""Config spaces derived from the device, named prune predicates, a cheap performance model.

A predicate says why it rejects a config; ``prune`` reports how many each rejected, so a
person can see why a space came out small (or empty, which is an error that says what
to do).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from registry.core.config import KernelConfig

if TYPE_CHECKING:
    import torch


class EmptySpace(ValueError):
    """Every config was pruned; the message lists each predicate's rejections."""


@dataclass(frozen=True)
class DeviceLimits:
    """What a config must fit: read off the device, or the interpreter's stand-in."""

    name: str
    sm_count: int
    shared_memory_bytes: int  # per block, the opt-in maximum
    compute_capability: tuple[int, int]
    peak_tflops: float  # dense bf16 matrix rate, for the performance model
    bandwidth_gbs: float

    @property
    def is_hopper(self) -> bool:
        return self.compute_capability >= (9, 0)

    @property
    def is_cpu(self) -> bool:
        return self.compute_capability == (0, 0)


CPU_LIMITS = DeviceLimits("cpu-interpreter", 4, 228 * 1024, (0, 0), 0.01, 10.0)


def device_limits(device: torch.device | str | int | None = None) -> DeviceLimits:
    """Limits of a CUDA device (index or torch.device), or the CPU stand-in."""
    import torch  # torch loads only when a device is read: pruning needs none

    if device is None and not torch.cuda.is_available():
        return CPU_LIMITS
    if device is not None and torch.device(device).type == "cpu":
        return CPU_LIMITS
    props = torch.cuda.get_device_properties(device)
    optin = getattr(props, "shared_memory_per_block_optin", 0) or 227 * 1024
    hopper = props.major >= 9
    return DeviceLimits(
        name=props.name,
        sm_count=props.multi_processor_count,
        shared_memory_bytes=int(optin),
        compute_capability=(props.major, props.minor),
        peak_tflops=790.0 if hopper else 300.0,
        bandwidth_gbs=4300.0 if hopper else 1500.0,
    )


@dataclass(frozen=True)
class Problem:
    """One AllGather-GEMM call: gathered M, per-rank N, K, ranks, element size."""

    m: int
    n: int
    k: int
    world: int
    element_bytes: int = 2

    @property
    def m_per_rank(self) -> int:
        return self.m // self.world


Predicate = Callable[[KernelConfig, Problem, DeviceLimits], bool]


def shared_memory_fits(c: KernelConfig, p: Problem, d: DeviceLimits) -> bool:
    """Pipelined A and B tiles plus the epilogue tile within the per-block limit. Triton
    on an H200 asked for 262,176 bytes at 128x256x64 with 4 stages and 237,608 at
    64x256x64 with 5: this sum, plus a few bytes of barriers."""
    bm, bn, bk = meta_int(c, "BLOCK_M"), meta_int(c, "BLOCK_N"), meta_int(c, "BLOCK_K")
    stages = (bm * bk + bk * bn) * p.element_bytes * c.num_stages
    epilogue = bm * bn * p.element_bytes // meta_int(c, "EPILOGUE_SUBTILE", 1)
    return stages + epilogue + 64 <= d.shared_memory_bytes


def enough_work_per_warp(c: KernelConfig, p: Problem, d: DeviceLimits) -> bool:
    """BM*BN/256 >= num_warps: each warp owns at least a 16x16 piece of the tile."""
    return meta_int(c, "BLOCK_M") * meta_int(c, "BLOCK_N") // 256 >= c.num_warps


def tile_divides_rank_block(c: KernelConfig, p: Problem, d: DeviceLimits) -> bool:
    """A tile inside one rank's rows waits for one shard, not two."""
    return p.m_per_rank % meta_int(c, "BLOCK_M") == 0


def tile_fits_problem(c: KernelConfig, p: Problem, d: DeviceLimits) -> bool:
    """No tile dimension more than twice the (power-of-two rounded) problem dimension."""
    return all(
        meta_int(c, name) <= 2 * _pow2(dim)
        for name, dim in (("BLOCK_M", p.m_per_rank), ("BLOCK_N", p.n), ("BLOCK_K", p.k))
    )


# Soft predicates are dropped when they alone would empty the space (odd sizes, where
# no tile divides a rank's block, still need a config).
PREDICATES: dict[str, tuple[Predicate, bool]] = {
    "shared_memory": (shared_memory_fits, False),
    "warps_per_tile": (enough_work_per_warp, False),
    "tile_fits_problem": (tile_fits_problem, True),
    "rank_block_divisible": (tile_divides_rank_block, True),
}


@dataclass
class PruneReport:
    kept: list[KernelConfig]
    rejected: dict[str, int] = field(default_factory=dict)  # predicate -> count
    waived: list[str] = field(default_factory=list)  # soft predicates that would empty it

    def describe(self) -> str:
        parts = [f"{name} rejected {n}" for name, n in self.rejected.items()]
        parts += [f"{name} waived (it would reject all)" for name in self.waived]
        return f"{len(self.kept)} kept; " + ("; ".join(parts) or "nothing rejected")


def prune(space: list[KernelConfig], problem: Problem, limits: DeviceLimits) -> PruneReport:
    """Apply every predicate in order; raise :class:`EmptySpace` if nothing survives."""
    report = PruneReport(kept=list(space))
    for name, (predicate, soft) in PREDICATES.items():
        kept = [c for c in report.kept if predicate(c, problem, limits)]
        if soft and not kept and report.kept:
            report.waived.append(name)
            continue
        report.rejected[name] = len(report.kept) - len(kept)
        report.kept = kept
    if not report.kept:
        raise EmptySpace(
            f"No config of {len(space)} fits {problem} on {limits.name}: "
            f"{report.describe()}. Widen the space or raise the limits."
        )
    return report


def predicted_us(c: KernelConfig, p: Problem, d: DeviceLimits) -> float:
    """A roofline with wave quantisation, tile efficiency and register pressure; for
    ordering candidates only, never reported as a time."""
    bm, bn, bk = meta_int(c, "BLOCK_M"), meta_int(c, "BLOCK_N"), meta_int(c, "BLOCK_K")
    tiles = math.ceil(p.m / bm) * math.ceil(p.n / bn)
    waves = math.ceil(tiles / d.sm_count)
    tile_flops = 2.0 * bm * bn * p.k
    # float ** float is typed Any (a negative base gives a complex); these bases are > 0.
    efficiency: float = min(1.0, (bm * bn) / (128 * 256)) ** 0.25 * min(1.0, bk / 64) ** 0.2
    efficiency *= min(1.0, c.num_stages / 3) ** 0.3
    accumulators_per_thread = bm * bn / (c.num_warps * 32)
    if accumulators_per_thread > 128:  # fp32 accumulators crowd out the rest: spills
        efficiency *= 128 / accumulators_per_thread
    compute_us = waves * tile_flops / (d.peak_tflops * 1e6 / d.sm_count * efficiency)
    # Grouped tile order keeps most re-reads in L2: charge the unique bytes twice.
    unique_bytes = (p.m * p.k + p.k * p.n + p.m * p.n) * p.element_bytes
    memory_us = 2 * unique_bytes / (d.bandwidth_gbs * 1e3)
    return max(compute_us, memory_us)


def ordered(
    configs: list[KernelConfig], problem: Problem, limits: DeviceLimits
) -> list[KernelConfig]:
    """Most promising first, by the performance model; ties keep the space's order."""
    return sorted(configs, key=lambda c: predicted_us(c, problem, limits))


def ag_gemm_space(limits: DeviceLimits) -> list[KernelConfig]:
    """The AllGather-GEMM space for a device: Hopper gets larger tiles, deeper pipes and
    the TMA consumer's own knobs (:func:`hopper_variants`); the interpreter gets small
    tiles (it runs every element on the CPU)."""
    blocks_m: tuple[int, ...]
    blocks_n: tuple[int, ...]
    blocks_k: tuple[int, ...]
    stages: tuple[int, ...]
    warps: tuple[int, ...]
    groups: tuple[int, ...]
    if limits.is_cpu:
        blocks_m, blocks_n, blocks_k = (16, 32), (16, 32), (16, 32)
        stages, warps, groups = (2,), (4,), (2,)
    elif limits.is_hopper:
        blocks_m, blocks_n, blocks_k = (64, 128, 256), (64, 128, 256), (64, 128)
        stages, warps, groups = (3, 4, 5), (4, 8), (8,)
    else:
        blocks_m, blocks_n, blocks_k = (64, 128), (64, 128, 256), (32, 64)
        stages, warps, groups = (2, 3, 4), (4, 8), (8,)
    return [
        KernelConfig.make(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, **knobs},
            num_warps=w,
            num_stages=s,
        )
        for bm in blocks_m
        for bn in blocks_n
        for bk in blocks_k
        for g in groups
        for s in stages
        for w in warps
        for knobs in (hopper_variants(bn) if limits.is_hopper else [{}])
    ]


def hopper_variants(block_n: int) -> list[dict[str, int | bool]]:
    """The TMA consumer's knobs for one tile: the plain one and, for a 256-wide tile,
    its epilogue stored in two halves (half the epilogue's shared memory, room for a
    deeper pipeline). Not warp specialisation: the loads would run in warps other than
    the ones that wait for a tile's flags and fence the async proxy, an ordering the
    PTX memory model does not give (measured: no better winners on 2 H200s)."""
    return [{}, {"EPILOGUE_SUBTILE": 2}] if block_n == 256 else [{}]


def meta_int(c: KernelConfig, name: str, default: int | None = None) -> int:
    """An integer meta-parameter of ``c`` (``default`` where it has none); ``ValueError``
    naming it otherwise."""
    value = c.meta.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{c.label()}: {name}={value!r} must be an int.")
    return value


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())
