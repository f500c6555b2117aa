"""How many CPUs this process may use: what the compile pool sizes itself by.

``os.cpu_count()`` is the node's count. In a Kubernetes container the CPU limit is a
cgroup quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``
in v1) and a CPU manager may pin it to a few cores (its affinity). A pool sized by the
node's count forks one compiler per core of a 128-core node into a container limited
to 8 CPUs, times the ranks of the pod: throttled, and many compilers' memory at once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The CPUs this process may run on (its affinity), capped by its cgroup's CPU
    quota rounded up; at least 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        count = os.cpu_count() or 1
    quota = cgroup_quota(root, proc_cgroup)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def cgroup_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The tightest CPU quota (in CPUs) of this process's cgroup and its ancestors, v2
    or v1; None when there is none, or none can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    quotas = []
    for line in lines:
        hierarchy, _, path = line.partition(":")[2].partition(":")
        controllers = set(hierarchy.split(","))
        if hierarchy == "":  # "0::/path": the v2 unified hierarchy
            quotas += [_v2(folder) for folder in _up_from(root, path)]
        elif "cpu" in controllers:
            base = root / hierarchy if (root / hierarchy).is_dir() else root / "cpu"
            quotas += [_v1(folder) for folder in _up_from(base, path)]
    found = [q for q in quotas if q is not None and q > 0]
    return min(found) if found else None


def _up_from(base: Path, path: str) -> list[Path]:
    """``base/path`` and each of its parents up to ``base`` (a container's cgroup
    namespace shows its own cgroup as ``/``)."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2(folder: Path) -> float | None:
    """``cpu.max``: "<quota> <period>" in microseconds, or "max <period>"."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1(folder: Path) -> float | None:
    """``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None
