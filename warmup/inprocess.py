"""``warmup.warm``: the warmup inside a server's own process (also primes its memory)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from registry import triton_internals
from warmup.manifest import Manifest, load_manifest
from warmup.results import RunStatus
from warmup.session import SELF_STARTED, RunError, run_session
from warmup.settings import Settings

log = logging.getLogger(__name__)


def warm_in_process(manifest: Manifest | str | Path, settings: Settings | None) -> RunStatus:
    import torch
    import torch.distributed as dist

    settings = settings or Settings()
    source = "<manifest>" if isinstance(manifest, Manifest) else str(manifest)
    if not isinstance(manifest, Manifest):
        manifest = load_manifest(Path(manifest))
    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    manifest.require_world(world, source)
    cuda = torch.cuda.is_available() and settings.device != "cpu"
    if settings.device == "cuda" and not cuda:
        raise RunError("device cuda: torch sees no CUDA GPU in this process; use device cpu")
    if not cuda:
        _interpret_on_cpu()
    manifest.check_kernels(source)  # imports the kernels: after the interpreter is on
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    status = run_session(
        settings,
        manifest,
        rank=rank,
        world=world,
        group=dist.group.WORLD if grouped else None,
        device=device,
        run_dir=settings.work_dir / "run",
        roles=SELF_STARTED,
        started=time.time(),
    )
    assert status is not None  # a self-started session always knows its status
    for failure in status.failures:
        log.error("warmup failed: %s", failure)
    return status


def _interpret_on_cpu() -> None:
    """On CPU, Triton kernels run only in its interpreter, which Triton picks when it is
    imported: turn it on, or say why it is too late."""
    if triton_internals.interpreting():
        return
    try:
        triton_internals.enable_interpreter()
    except ValueError as e:
        raise RunError(
            f"warm() on CPU runs Triton kernels in Triton's interpreter, and {e}: set "
            "TRITON_INTERPRET=1 before anything imports triton (or warm on a GPU)"
        ) from None
    log.info("no GPU: Triton's interpreter is on in this process (TRITON_INTERPRET=1)")
