"""``python -m tests.warmup.compiled._ranks OUT``: one gloo rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT from the environment) warms two models, the first failing on
rank 1 only; writes its results to OUT/rank-<r>.json."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from registry.core.fingerprint import cpu_fingerprint
from warmup.compiled.warm import warm_models
from warmup.core.manifest import parse_manifest
from warmup.core.services import Services
from warmup.core.settings import Settings

MANIFEST = """\
version: 1
models:
  - name: uneven
    build: tests.warmup.compiled.models:fails_on_rank_1_at_batch_3
    world_size: 2
    dims: {batch: [1, 3, 4]}
    inputs: [{shape: [batch, 8], dtype: fp32}]
  - name: even
    build: tests.warmup.compiled.models:doubles
    world_size: 2
    dims: {batch: [1, 2]}
    inputs: [{shape: [batch, 8], dtype: fp32}]
"""


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    settings = Settings(volume=out / "volume", work_dir=out / f"work-{rank}", rank_timeout_s=20)
    results = warm_models(
        parse_manifest(MANIFEST).models,
        Services(settings, run=True),
        rank=rank,
        group=dist.group.WORLD,
        device=torch.device("cpu"),
        fingerprint=cpu_fingerprint(),
    )
    rows = [r.model_dump(mode="json") for r in results]
    (out / f"rank-{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
