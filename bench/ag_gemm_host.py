"""Host microseconds per ``ag_gemm`` call: this version against an earlier one, same
process, same config, same clock (``bench.ag_gemm.host_us``), one host's GPUs.

    git show 6b18625:kernels/ag_gemm.py > /tmp/ag_gemm_before.py
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python -m torch.distributed.run --nproc-per-node 2 bench/ag_gemm_host.py \\
        --before /tmp/ag_gemm_before.py

The earlier module is loaded from its file under another name (it must still import
against this tree's ``kernels.adapter``). Per shape and version: the fused algorithm
with the bench's TMA check config and the NCCL + cuBLAS baseline, each with a given
output and with ``out=None``. Rank 0 prints one line per shape.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

from bench.ag_gemm import TMA_CHECK, host_us
from kernels import ag_gemm

SHAPES = [(256, 7168, 8192), (1024, 7168, 8192), (64, 4096, 4096), (4096, 3584, 8192)]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("ag_gemm_before", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def host_row(module: ModuleType, shape: tuple[int, int, int]) -> dict[str, float]:
    m, n, k = shape
    world = dist.get_world_size()
    shard = torch.randn(m // world, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ctx = module.create_context(dist.group.WORLD, max_m=m, k=k, dtype=shard.dtype, device="cuda")
    row = {}
    for label, config in (("fused", TMA_CHECK), ("baseline", ag_gemm.BASELINE_CONFIG)):
        for _ in range(10):  # compiled, prepared, warm
            module.ag_gemm(shard, b, ctx, config, out=out)
        row[label] = host_us(lambda c=config: module.ag_gemm(shard, b, ctx, c, out=out))
        row[f"{label} out=None"] = host_us(lambda c=config: module.ag_gemm(shard, b, ctx, c))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="an earlier ag_gemm.py")
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    before = load(args.before)
    for shape in SHAPES:
        rows = {"before": host_row(before, shape), "after": host_row(ag_gemm, shape)}
        if dist.get_rank() == 0:
            cells = [f"{v} {k_}={us:.1f}" for v, row in rows.items() for k_, us in row.items()]
            print(f"HOST {','.join(map(str, shape))}: " + ", ".join(cells), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
