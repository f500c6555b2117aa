"""The ``triton-warmup`` program (also ``python -m warmup``).

For ``run`` it starts the rank processes first (``warmup.run.early``): they import
torch while this process imports the command line and reads its settings and manifest,
which takes most of a second. And ``run`` ends as soon as its status and summary are
out, without Python's teardown of torch and triton: the pod is ready when it ends.
Every other command goes straight to ``warmup.cli``.
Imports only the standard library and ``warmup.run.early`` before that.
"""

from __future__ import annotations

import sys

from warmup.run.early import EarlyRanks
from warmup.run.gpus import visible_gpus


def entry() -> None:
    argv = sys.argv[1:]
    run = argv[:1] == ["run"]
    gpus = visible_gpus() if run else 0
    early = EarlyRanks.start(gpus) if gpus else None
    try:
        from warmup.cli import main  # a broken install ends the early ranks too

        code = main(argv, early=early)
    finally:
        if early is not None:
            early.stop()  # no-op once the run took them
    if run or argv[:1] == ["serve"]:  # a stopped sidecar: no second of teardown at SIGTERM
        from warmup.core import logs  # after the run: only stdlib before the ranks start

        logs.exit_now(code)
    sys.exit(code)
