"""Rank processes started before the launcher has read its settings.

Most of a warm start is the ranks importing torch; before a rank can start, the launcher
imports pydantic and the project and reads its settings and manifest (0.6 to 0.9 s on
an H100 host). ``triton-warmup run`` therefore starts one process per visible GPU first
(:class:`EarlyRanks`). Each imports torch and the project while the launcher parses,
then waits on its stdin for one line from the launcher:

    a JSON object   its rank's environment: it runs as a spawned rank from there
                    (``warmup.run.session``)
    end of file     the launcher is gone (or sent an empty line): it ends

Those the launcher does not need (more than the run's ranks, or bad input) are killed:
they have done nothing but import. Fewer than the run's ranks all become ranks, and the
launcher starts the others.

Nothing here imports more than the standard library, so the program can start them
first. A rank imports nothing that reads Triton's environment before its line arrives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from warmup.run.phases import process_age

log = logging.getLogger(__name__)


class EarlyRanks:
    """Rank processes started ahead, each waiting for its environment on stdin."""

    def __init__(self, procs: Sequence[subprocess.Popen[bytes]], started_s: float) -> None:
        self.procs = list(procs)
        self.started_s = started_s  # the launcher's age when it started them

    @classmethod
    def start(cls, count: int) -> EarlyRanks:
        started_s = process_age()
        return cls([_start_one() for _ in range(count)], started_s)

    def __len__(self) -> int:
        return len(self.procs)

    def hand_over(self, envs: Sequence[Mapping[str, str]]) -> list[subprocess.Popen[bytes]]:
        """Give each process its rank's environment; they are the run's ranks from now.

        One that died while it imported (killed, out of memory) is replaced by a new one,
        which imports from the start. One that cannot be told its line is killed, so the
        launcher sees a failed rank, not one that waits on its peers until the time limit."""
        assert len(envs) == len(self.procs), (len(envs), len(self.procs))
        for i, proc in enumerate(self.procs):  # replaced in place: stop() ends every one
            if proc.poll() is not None:
                log.warning(
                    "an early rank process (pid %d) ended with code %s before its rank "
                    "was given; starting a new one",
                    proc.pid,
                    proc.returncode,
                )
                _close(proc)
                self.procs[i] = _start_one()
        procs, self.procs = self.procs, []
        for proc, env in zip(procs, envs, strict=True):
            if not _tell(proc, json.dumps(dict(env))):
                proc.kill()
        return procs

    def keep(self, count: int) -> None:
        """End all but the first ``count`` (a pod with fewer ranks than GPUs)."""
        extra, self.procs = self.procs[count:], self.procs[:count]
        _end(extra)

    def stop(self) -> None:
        """End every process not handed over: it has done nothing but import."""
        procs, self.procs = self.procs, []
        _end(procs)


def _end(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()
        _close(proc)


def _start_one() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "warmup.run.early"], stdin=subprocess.PIPE)


def _tell(proc: subprocess.Popen[bytes], line: str) -> bool:
    """Write ``line`` and end the process's input; False if it could not be written."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
    except (OSError, ValueError) as e:  # it died since (a broken pipe), or input closed
        log.warning("could not give rank process %d its environment: %s", proc.pid, e)
        return False
    finally:
        _close(proc)
    return True


def _close(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # the unwritten rest of a broken pipe
            proc.stdin.close()


def main() -> int:
    """An early rank: import, wait for the launcher's line, then run as a rank."""
    import torch.distributed  # noqa: F401  the long pole, while the launcher parses

    from warmup.run import session  # after torch, the early rank's long pole

    waiting = time.monotonic()
    line = sys.stdin.readline()
    waited = time.monotonic() - waiting
    if not line.strip():
        return 0
    os.environ.update(json.loads(line))
    return session.main(waited_s=waited)


if __name__ == "__main__":
    sys.exit(main())
