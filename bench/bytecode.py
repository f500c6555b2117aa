"""Byte-compile what the program imports, as it is in the image.

``pip install`` (the Dockerfile's ``deploy/install.sh``) writes the bytecode of every
module it installs; the image's ``PYTHONDONTWRITEBYTECODE=1`` only stops later writes.
A bench that runs the program from a source tree where that variable is set (the GPU
machine sets it) would compile the project, pydantic and the rest from source in every
process it starts, which no pod pays: ``warmup.run.session`` alone took 0.4 s more to
import on an H100 host, and a 1-rank warm start 7.65 s instead of 4.34 s (the floor
6.40 s instead of 3.83 s). The benches call :func:`compile_imports` before their first
timed run (:func:`add_option`, :func:`compile_unless`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import py_compile
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# What the launcher, the ranks, the finisher and a floor rank import.
PROGRAM = (
    "warmup.program",
    "warmup.cli",
    "warmup.run.session",
    "warmup.run.runner",
    "warmup.core.metrics",
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


def add_option(parser: argparse.ArgumentParser) -> None:
    """``--no-bytecode``: measure as the runs before 2026-11-23 did."""
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="leave modules without bytecode as they are (runs before 2026-11-23 did)",
    )


def compile_unless(skip: bool) -> None:
    """:func:`compile_imports`, said on stdout, unless ``--no-bytecode`` was given."""
    if not skip:
        compiled = compile_imports()
        print(f"bytecode written for {len(compiled)} modules (the image has it)", flush=True)


def compile_imports(
    modules: Sequence[str] = PROGRAM,
    env: Mapping[str, str] | None = None,
    roots: Sequence[Path] | None = None,
) -> list[str]:
    """Write the missing or stale bytecode of every module that importing ``modules``
    loads (in a fresh process with ``env``), only under ``roots`` if given; returns the
    sources compiled. A folder that cannot be written stays as it is. Modules imported
    later (Triton's compiler on a first compile) are not among them."""
    listing = subprocess.run(
        [sys.executable, "-c", _LIST, *modules],
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
    )
    if listing.returncode != 0:
        raise RuntimeError(f"importing {', '.join(modules)} failed:\n{listing.stderr[-3000:]}")
    compiled = []
    for source in listing.stdout.splitlines():
        if roots is not None and not any(Path(source).is_relative_to(r) for r in roots):
            continue
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
    """Whether Python would load ``cached`` for ``source``: the header's magic number,
    and the source's mtime and size it records (a hash-based one is taken as it is)."""
    try:
        with open(cached, "rb") as f:
            header = f.read(16)
        stat = os.stat(source)
    except OSError:
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(header[4:8], "little") & 1:  # hash-based (PEP 552)
        return True
    recorded = (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little"))
    return recorded == (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
