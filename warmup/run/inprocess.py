"""``warmup.warm``: the warmup inside a server's own process (also primes its memory)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from warmup.core.manifest import Manifest, load_manifest
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.run import checks
from warmup.run.session import SELF_STARTED, run_session

log = logging.getLogger(__name__)


def warm_in_process(manifest: Manifest | str | Path, settings: Settings | None) -> RunStatus:
    import torch  # torch loads on first use
    import torch.distributed as dist  # torch loads on first use

    settings = settings or Settings()
    source = "<manifest>" if isinstance(manifest, Manifest) else str(manifest)
    if not isinstance(manifest, Manifest):
        manifest = load_manifest(Path(manifest))
    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    caller = checks.self_started(source, checks.VOLUME_FIX_PYTHON)
    # this process's services, built once here: warm() is an entry point
    checked = checks.checked(Services(settings, run=True), manifest, world, caller)
    cuda = checked.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    status = run_session(
        checked.services,
        manifest,
        rank=rank,
        world=world,
        group=dist.group.WORLD if grouped else None,
        device=device,
        run_dir=settings.paths.work_dir / "run",
        roles=SELF_STARTED,
        started=time.time(),
    )
    assert status is not None  # a self-started session always knows its status
    for failure in status.failures:
        log.error("warmup failed: %s", failure)
    return status
