"""The CPUs a container may use: its cgroup quota (v2 and v1) and affinity, not the
node's count."""

import os
from pathlib import Path

import pytest

from warmup.tuning.cpus import cgroup_quota, usable_cpus


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, text: str) -> Path:
    _write(tmp_path / "proc-cgroup", text)
    return tmp_path / "proc-cgroup"


def test_v2_the_tightest_quota_of_the_cgroup_and_its_parents(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cpu.max", "max 100000\n")
    _write(root / "kubepods" / "cpu.max", "800000 100000\n")  # the pod: 8 CPUs
    _write(root / "kubepods" / "ctr" / "cpu.max", "250000 100000\n")  # the container: 2.5
    proc = _proc(tmp_path, "0::/kubepods/ctr\n")
    assert cgroup_quota(root, proc) == 2.5


def test_v2_in_a_cgroup_namespace_reads_its_own_root(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cpu.max", "400000 100000\n")
    assert cgroup_quota(root, _proc(tmp_path, "0::/\n")) == 4.0


def test_v1_quota_over_period_and_minus_one_is_none(tmp_path):
    root = tmp_path / "cg"
    _write(root / "cpu,cpuacct" / "pod" / "cpu.cfs_quota_us", "300000\n")
    _write(root / "cpu,cpuacct" / "pod" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    proc = _proc(tmp_path, "4:memory:/pod\n3:cpu,cpuacct:/pod\n2:cpuacct:/x\n")
    assert cgroup_quota(root, proc) == 3.0
    proc = _proc(tmp_path, "3:cpu,cpuacct:/\n")
    assert cgroup_quota(root, proc) is None


@pytest.mark.parametrize(
    "files",
    [{}, {"cpu.max": "max 100000"}, {"cpu.max": "garbage"}, {"cpu.max": "0 100000"}],
)
def test_no_readable_quota_is_none(tmp_path, files):
    root = tmp_path / "cg"
    root.mkdir()
    for name, text in files.items():
        _write(root / name, text)
    assert cgroup_quota(root, _proc(tmp_path, "0::/\n")) is None
    assert cgroup_quota(root, tmp_path / "missing") is None


def test_usable_cpus_is_the_affinity_capped_by_the_quota_rounded_up(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    root = tmp_path / "cg"
    _write(root / "cpu.max", "50000 100000\n")  # half a CPU: still 1
    assert usable_cpus(root, _proc(tmp_path, "0::/\n")) == 1
    _write(root / "cpu.max", f"{(affinity + 7) * 100000} 100000\n")  # above: the affinity
    assert usable_cpus(root, _proc(tmp_path, "0::/\n")) == affinity
    assert usable_cpus(root, tmp_path / "missing") == affinity
