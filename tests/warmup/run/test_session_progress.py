"""The session shows rank 0's compiled-model progress (``warmup.compiled.progress``):
``warmup.warm`` in this process, a model that compiles nothing, on CPU."""

from __future__ import annotations

import logging
import re

from tests.conftest import settings_for
from warmup.core.manifest import parse_manifest
from warmup.run.inprocess import warm_in_process

MANIFEST = """
version: 1
models:
  - {name: m, build: "tests.warmup.compiled.models:doubles", world_size: 1,
     dims: {batch: [1, 2]}, inputs: [{shape: [batch, 8], dtype: fp32}]}
"""


def test_rank_0_logs_each_shape_of_a_model_with_the_time_so_far(tmp_path, caplog):
    settings = settings_for(tmp_path, create_volume=True)
    with caplog.at_level(logging.INFO, "warmup.compiled.progress"):
        status = warm_in_process(parse_manifest(MANIFEST), settings)
    assert status.ready, status.failures
    lines = [r.getMessage() for r in caplog.records if r.name == "warmup.compiled.progress"]
    assert re.fullmatch(
        r"model m: restore: miss: no artifacts of model m are stored \(\d+\.\d s\)", lines[0]
    )
    assert lines[2].startswith("model m: shape 1/2 (batch=1) ran in ")
    assert lines[3].startswith("model m: shape 2/2 (batch=2) ran in ") and "s so far" in lines[3]
    assert len(lines) == 4
