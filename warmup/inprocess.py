"""``warmup.warm``: the warmup inside a server's own process (also primes its memory)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from registry import atomic, triton_cache
from warmup.launch import finish
from warmup.manifest import Manifest, load_manifest
from warmup.settings import Settings


def warm_in_process(manifest: Manifest | str | Path, settings: Settings | None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from warmup.runner import progress_printer, warm_rank

    settings = settings or Settings()
    if not isinstance(manifest, Manifest):
        manifest = load_manifest(Path(manifest))
    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    cuda = torch.cuda.is_available() and settings.device != "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    run_dir = settings.work_dir / "run"
    started = time.time()
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in run_dir.glob("rank-*.json"):
            old.unlink()
        _restore(settings)
    if grouped:
        dist.barrier()
    report = warm_rank(
        manifest,
        settings,
        rank=rank,
        world=world,
        group=dist.group.WORLD if grouped else None,
        device=device,
        progress=progress_printer() if rank == 0 else None,
    )
    atomic.write_json(run_dir / f"rank-{rank}.json", report.__dict__)
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
