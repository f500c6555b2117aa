"""Logging configured explicitly, and a process end that loses no line."""

import os
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
import logging, sys
from warmup.core import logs
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


def test_exit_now_ends_with_the_code_when_stdout_is_closed():
    script = "import sys\nfrom warmup.core import logs\nsys.stdout.close()\nlogs.exit_now(4)\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (done.returncode, done.stderr) == (4, "")


def test_exit_now_flushes_what_a_library_printed_through_c():
    # a pipe makes C's stdout fully buffered (unless PYTHONUNBUFFERED turns that off):
    # os._exit alone would drop this line
    script = (
        "import ctypes\nctypes.CDLL(None).printf(b'from C without a newline')\n"
        "from warmup.core import logs\nlogs.exit_now(0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert (done.returncode, done.stdout) == (0, "from C without a newline")
