"""Byte-compile what the program imports, as it is in the image.

``pip install`` (the Dockerfile's ``deploy/install.sh``) writes the bytecode of every
module it installs; the image's ``PYTHONDONTWRITEBYTECODE=1`` only stops later writes.
A bench that runs the program from a source tree where that variable is set (the GPU
machine sets it) would compile the project, pydantic and the rest from source in every
process it starts, which no pod pays: ``warmup.run.session`` alone took 0.4 s more to
import on an H100 host, and a 1-rank warm start 7.65 s instead of 4.34 s (the floor
6.40 s instead of 3.83 s). The benches call :func:`compile_imports` before their first
timed run.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
from collections.abc import Mapping, Sequence

# What the launcher, the ranks, the finisher and a floor rank import.
PROGRAM = (
    "warmup.program",
    "warmup.cli",
    "warmup.run.session",
    "warmup.run.runner",
    "warmup.metrics",
    "kernels.ag_gemm",
    "kernels.matmul",
)

_LIST = (
    "import importlib, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "files = {getattr(m, '__file__', None) or '' for m in list(sys.modules.values())}\n"
    "print('\\n'.join(sorted(f for f in files if f.endswith('.py'))))\n"
)


def compile_imports(
    modules: Sequence[str] = PROGRAM, env: Mapping[str, str] | None = None
) -> list[str]:
    """Write the missing or stale bytecode of every module that importing ``modules``
    loads (in a fresh process with ``env``); returns the sources compiled. A folder that
    cannot be written stays as it is."""
    listing = subprocess.run(
        [sys.executable, "-c", _LIST, *modules],
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        check=True,
    )
    compiled = []
    for source in listing.stdout.splitlines():
        cached = importlib.util.cache_from_source(source)
        if _fresh(source, cached):
            continue
        try:
            py_compile.compile(source, cfile=cached, doraise=True)
        except (py_compile.PyCompileError, OSError):
            continue
        compiled.append(source)
    return compiled


def _fresh(source: str, cached: str) -> bool:
    try:
        return os.stat(cached).st_mtime >= os.stat(source).st_mtime
    except OSError:
        return False
