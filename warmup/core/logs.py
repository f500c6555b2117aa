"""Logging, configured explicitly (never at import): a rank-aware text or JSON formatter."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import sys
import time
from typing import NoReturn


class _JsonFormatter(logging.Formatter):
    def __init__(self, rank: int | None) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str | int] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.rank is not None:
            entry["rank"] = self.rank
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (it may be swapped)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


def configure(fmt: str = "text", *, rank: int | None = None, level: int = logging.INFO) -> None:
    """Route warmup, registry and kernels logs to stderr in ``fmt`` ("text" or "json")."""
    handler = _StderrHandler()
    if fmt == "json":
        handler.setFormatter(_JsonFormatter(rank))
    else:
        prefix = f"[rank {rank}] " if rank is not None else ""
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s", "%H:%M:%S"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in ("warmup", "registry", "kernels"):
        logging.getLogger(name).setLevel(level)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once every log line and stdio buffer is out, without
    Python's teardown: for a process whose work is written and whose imports (torch,
    triton, NCCL, a CUDA context) take a second to unwind, which the pod waits for."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or None
            stream.flush()  # or its reader is gone: nothing more can be kept
    _flush_c_stdio()  # what a library printed through C (NCCL, a compiler) is out too
    os._exit(code)


def _flush_c_stdio() -> None:
    with contextlib.suppress(ImportError, OSError, AttributeError):  # no C library to ask
        ctypes.CDLL(None).fflush(None)  # every C stream of the process
