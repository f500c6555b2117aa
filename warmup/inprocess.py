"""``warmup.warm``: the warmup inside a server's own process (also primes its memory)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from registry import triton_cache
from warmup.launch import clear_run_dir, finish, warm_and_report
from warmup.manifest import Manifest, load_manifest
from warmup.settings import Settings


def warm_in_process(manifest: Manifest | str | Path, settings: Settings | None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    settings = settings or Settings()
    if not isinstance(manifest, Manifest):
        manifest = load_manifest(Path(manifest))
    manifest.check_kernels()
    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    cuda = torch.cuda.is_available() and settings.device != "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    run_dir = settings.work_dir / "run"
    started = time.time()
    if rank == 0:
        clear_run_dir(run_dir)
        _restore(settings)
    if grouped:
        dist.barrier()
    group = dist.group.WORLD if grouped else None
    warm_and_report(manifest, settings, run_dir, rank=rank, world=world, group=group, device=device)
    if grouped:
        dist.barrier()
    status = finish(settings, manifest, run_dir, world, started, []) if rank == 0 else {}
    if grouped:
        holder = [status]
        dist.broadcast_object_list(holder, src=0)
        status = holder[0]
    return status


def _restore(settings: Settings) -> None:
    """Restore the volume's compile cache into ``settings.cache_dir``: set
    TRITON_WARMUP_TRITON_CACHE_DIR to the TRITON_CACHE_DIR this process's Triton uses."""
    triton_cache.restore(settings.paths.triton_cache, settings.cache_dir)
