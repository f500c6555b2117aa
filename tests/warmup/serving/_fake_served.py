"""A served layer that records what it is asked, and the matmul entries it is served from:
the serving op's collaborators tested without a kernel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernels import matmul
from registry import Entry, KernelConfig, cpu_fingerprint

N, K, MAX_M = 24, 40, 100


def config(block_m: int, algorithm: str | None = None) -> KernelConfig:
    return KernelConfig.make(
        {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2},
        algorithm=algorithm,
        num_warps=4,
    )


def entry(m: int, block_m: int, algorithm: str | None = None, n: int = N) -> Entry:
    key = matmul.ADAPTER.key(m=m, n=n, k=K, dtype="fp32", world=1)
    fingerprint = cpu_fingerprint(matmul.kernel_hash())
    return Entry.make("matmul", key, fingerprint, config(block_m, algorithm), source="tuned")


class FakeServed:
    """The matmul layer (N, K, fp32) on the CPU; ``rank0``: what rank 0 holds in an
    agreement (None: this rank's own); ``peers_built``: whether the other ranks built."""

    kernel = "matmul"
    rows_step = 1
    device = torch.device("cpu")
    group = None

    def __init__(self, *, collective: bool = False) -> None:
        self.collective = collective
        self.rank0: Any = None
        self.peers_built = True
        self.prepared: list[tuple[KernelConfig, list[int]]] = []
        self.rehearsed: list[list[KernelConfig]] = []
        self.agreed = 0
        self.fail_prepare = False

    def key(self, m: int) -> dict[str, Any]:
        return matmul.ADAPTER.key(m=m, n=N, k=K, dtype="fp32", world=1)

    def rows(self, a: Any, b: Any, /) -> int:
        return int(a)

    def __call__(self, config: KernelConfig, a: Any, b: Any, /, *, out: Any = None) -> Any:
        return config

    def prepare(self, config: KernelConfig, rows: Sequence[int]) -> None:
        if self.fail_prepare:
            raise MemoryError("out of memory")
        self.prepared.append((config, list(rows)))

    def rehearse(self, configs: Sequence[KernelConfig]) -> None:
        self.rehearsed.append(list(configs))

    def default_config(self) -> KernelConfig:
        return config(128)

    def agree(self, value: Any) -> Any:
        self.agreed += 1
        return value if self.rank0 is None else self.rank0

    def all_true(self, flag: bool) -> bool:
        return flag and self.peers_built
