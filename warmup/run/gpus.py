"""The GPUs this process may use, counted from the driver's files: no torch, no
subprocess, nothing beyond the standard library (the program counts them before it
starts the early ranks)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

# The NVIDIA driver's list of GPUs, one folder each (``registry.core.fingerprint.NVIDIA_PROC``,
# not imported: the registry package costs 0.1 s before the first rank starts).
GPU_LIST = Path("/proc/driver/nvidia/gpus")


def listed_gpus(gpu_list: Path = GPU_LIST) -> int:
    """GPUs the NVIDIA driver lists (one folder each); 0 without a driver. No torch, no
    subprocess: cheap enough for a launcher's start."""
    try:
        return sum(1 for _ in gpu_list.iterdir())
    except OSError:
        return 0


def visible_gpus(gpu_list: Path = GPU_LIST) -> int:
    """GPUs the driver lists, fewer when CUDA_VISIBLE_DEVICES hides some; no torch."""
    listed = listed_gpus(gpu_list)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return listed
    ids = (d.strip() for d in visible.split(",") if d.strip())
    shown = itertools.takewhile(lambda d: not d.startswith("-"), ids)  # "-1" hides the rest
    return min(listed, sum(1 for _ in shown))
