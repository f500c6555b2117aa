"""Logging configured explicitly, and a process end that loses no line."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
import logging, sys
from warmup import logs
logs.configure("text", rank=1)
logging.getLogger("warmup.test").warning("a warning before the end")
print("no newline and no flush", end="")
sys.stderr.write("a partial line")
logs.exit_now(3)
print("never")
"""


def test_exit_now_flushes_every_line_and_ends_with_the_code():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 3
    assert done.stdout == "no newline and no flush"
    assert "a warning before the end" in done.stderr and "rank 1" in done.stderr
    assert done.stderr.endswith("a partial line")
