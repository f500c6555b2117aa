"""The sidecar's bundle watcher at idle and under a burst of changes (CPU, no GPU).

    .venv/bin/python bench/watcher_idle.py --seconds 60

A real ``Sidecar`` (real watchdog observer, real ``bundle.install`` into a temp store)
watches a temp folder holding a few bundles, one reached ConfigMap-style through
``..data``. Idle: after the first scan installed them, nothing changes for ``--seconds``;
reported are the scans per minute, the files hashed, the installs per bundle and the
peak thread count. Burst: ``--burst`` changes (touches, reads, renames, ConfigMap swaps
of the same bundle, writes of other files) and one new bundle; reported are the scans
and the installs they caused. Defaults: the settings' debounce, the watcher's checks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))  # the tests' bundle and status helpers

from registry import Store
from registry.bundles import bundle
from tests.conftest import wait_for
from tests.warmup.sidecar.test_server import make_bundle, ready_status
from warmup.core.settings import Settings
from warmup.sidecar import watcher as watcher_module
from warmup.sidecar.server import Sidecar

ROOT = Path(__file__).parents[1]
DEMO = ROOT / "examples" / "demo.yaml"


def configmap_swap(folder: Path, data: Path, stamp: str) -> None:
    """What the kubelet does: a new ``..<time>`` folder, ``..data`` renamed onto it."""
    target = folder / f"..{stamp}"
    target.mkdir()
    shutil.copy(data, target / "fleet.tgz")
    (folder / "..data_tmp").symlink_to(target.name)
    os.replace(folder / "..data_tmp", folder / "..data")


class Sampler:
    """Peak thread count, sampled every 50 ms in a thread of its own."""

    def __init__(self) -> None:
        self.peak = threading.active_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, threading.active_count() - 1)  # not the sampler


def installs_per_bundle(store_path: Path) -> Counter[str]:
    return Counter(g.bundle["sha256"] for g in bundle.installed(Store(store_path, create=True)))


def settled(predicate: Any) -> None:
    if not wait_for(predicate, timeout=30.0):
        sys.exit("timed out waiting for the watcher")


def burst(folder: Path, count: int, work: Path) -> None:
    """``count`` changes that bring no new bundle, then one new bundle."""
    fleet = work / "fleet.tgz"
    for i in range(count):
        kind = i % 5
        if kind == 0:
            os.utime(folder / "a.tgz")
        elif kind == 1:
            (folder / "a.tgz").read_bytes()
        elif kind == 2:
            os.replace(folder / "b.tgz", folder / "b-renamed.tgz")
            os.replace(folder / "b-renamed.tgz", folder / "b.tgz")
        elif kind == 3:
            configmap_swap(folder, fleet, f"burst-{i}")
        else:
            (folder / "notes.txt").write_text(str(i))
        time.sleep(0.02)
    shutil.copy(make_bundle(work, "new", 512), folder / "new.tgz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle time (default 60)")
    parser.add_argument("--burst", type=int, default=50, help="changes in the burst")
    args = parser.parse_args()
    hashed = []
    real_sha = watcher_module.sha256_of
    watcher_module.sha256_of = lambda file: hashed.append(1) or real_sha(file)  # type: ignore[assignment]

    with tempfile.TemporaryDirectory(prefix="watcher-bench-") as tmp:
        work = Path(tmp)
        settings = Settings(volume=work / "volume", work_dir=work / "work", manifest=DEMO)
        ready_status(settings)
        folder = settings.paths.bundle_dir
        folder.mkdir(parents=True)
        for name, m in (("a", 64), ("b", 128), ("c", 256)):
            shutil.copy(make_bundle(work, name, m), folder / f"{name}.tgz")
        fleet = make_bundle(work, "fleet", 384)
        configmap_swap(folder, fleet, "first")
        (folder / "fleet.tgz").symlink_to("..data/fleet.tgz")
        bundles = 4

        threads_before = threading.active_count()
        car = Sidecar(settings)
        car.start(host="127.0.0.1", port=0)
        try:
            settled(lambda: len(installs_per_bundle(settings.paths.registry_dir)) == bundles)
            time.sleep(3 * max(car.watcher.debounce_s, car.watcher.check_s))  # settled
            scans, files = car.watcher.scans, len(hashed)
            with Sampler() as sampler:
                time.sleep(args.seconds)
            idle_scans, idle_hashed = car.watcher.scans - scans, len(hashed) - files
            idle_installs = installs_per_bundle(settings.paths.registry_dir)

            scans = car.watcher.scans
            burst(folder, args.burst, work)
            settled(lambda: len(installs_per_bundle(settings.paths.registry_dir)) == bundles + 1)
            time.sleep(3 * max(car.watcher.debounce_s, car.watcher.check_s))
            burst_scans = car.watcher.scans - scans
            burst_installs = installs_per_bundle(settings.paths.registry_dir)
        finally:
            car.stop()

    per_bundle = sorted(set(idle_installs.values()))
    print(
        f"\nsidecar watcher, debounce {settings.sidecar.reload_debounce_s:g} s, "
        f"checks every {car.watcher.check_s:g} s, {bundles} bundles, idle {args.seconds:g} s\n"
    )
    print("| measure | value |")
    print("|---|---:|")
    print(f"| scans per minute while idle | {idle_scans * 60 / args.seconds:.2f} |")
    print(f"| files hashed while idle | {idle_hashed} |")
    print(f"| installs per bundle (first scan + idle) | {', '.join(map(str, per_bundle))} |")
    print(f"| threads before start / peak while idle | {threads_before} / {sampler.peak} |")
    print(f"| burst: changes, then 1 new bundle | {args.burst} + 1 |")
    print(f"| burst: scans | {burst_scans} |")
    print(f"| burst: installs (all bundles, total) | {sum(burst_installs.values()) - bundles} |")
    print(f"| installs per bundle after the burst | {max(burst_installs.values())} |")


if __name__ == "__main__":
    main()
