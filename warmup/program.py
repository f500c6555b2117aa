"""The ``triton-warmup`` program (also ``python -m warmup``).

For ``run`` it starts the rank processes first (``warmup.run.early``): they import
torch while this process imports the command line and reads its settings and manifest,
which takes most of a second. Every other command goes straight to ``warmup.cli``.
Imports only the standard library and ``warmup.run.early`` before that.
"""

from __future__ import annotations

import sys

from warmup.run.early import EarlyRanks, visible_gpus


def entry() -> None:
    argv = sys.argv[1:]
    gpus = visible_gpus() if argv[:1] == ["run"] else 0
    early = EarlyRanks.start(gpus) if gpus else None
    from warmup.cli import main

    try:
        code = main(argv, program=True, early=early)
    finally:
        if early is not None:
            early.stop()  # no-op once the run took them
    sys.exit(code)
