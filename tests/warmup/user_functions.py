"""User warm functions named by test manifests (``tests.warmup.user_functions:...``)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import torch.distributed as dist


def record_call(*, shape: dict[str, int], dtype: Any, device: Any) -> None:
    """Append what it was called with to the file named by TEST_USER_LOG."""
    with Path(os.environ["TEST_USER_LOG"]).open("a") as log:
        log.write(
            json.dumps(
                {
                    "shape": shape,
                    "dtype": str(dtype),
                    "device": str(device),
                    "rank": dist.get_rank() if dist.is_initialized() else 0,
                    # what Serving() made here from the environment would read
                    "manifest": os.environ.get("TRITON_WARMUP_MANIFEST"),
                    "volume": os.environ.get("TRITON_WARMUP_VOLUME"),
                }
            )
            + "\n"
        )


def die_on_rank_1(*, shape: dict[str, int], dtype: Any, device: Any) -> None:
    if dist.is_initialized() and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def raise_error(*, shape: dict[str, int], dtype: Any, device: Any) -> None:
    raise RuntimeError(f"no kernel for {shape}")


def takes_positional_only(shape, /):  # type: ignore[no-untyped-def]
    """Not callable as a warm function: a warmup passes shape=, dtype=, device=."""


def record_status(*, shape: dict[str, int], dtype: Any, device: Any) -> None:
    """Append the state of the status file named by TEST_STATUS_PATH to TEST_USER_LOG."""
    status = json.loads(Path(os.environ["TEST_STATUS_PATH"]).read_text())
    with Path(os.environ["TEST_USER_LOG"]).open("a") as log:
        log.write(status["state"] + "\n")
