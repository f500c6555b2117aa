"""Choosing the execution platform explicitly, once, before kernels are imported."""

from __future__ import annotations

import os


def use_interpreter() -> bool:
    """Run Triton kernels on CPU through the interpreter when there is no GPU.

    Triton reads TRITON_INTERPRET when a kernel module is imported, so call this first.
    Returns True when the interpreter is on.
    """
    import torch

    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True
