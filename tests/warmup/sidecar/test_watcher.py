"""The bundle watcher: one scan at a time, on changes only, each bundle installed once."""

import hashlib
import os
import threading
import time
import tracemalloc

import pytest

from tests.conftest import wait_for
from warmup.sidecar import watcher as watcher_module
from warmup.sidecar.watcher import BundleWatcher


class Installs:
    """A fake install that reads the bundle as ``bundle.install`` does, records each call,
    and notes whether two calls ever ran at once."""

    def __init__(self, *, seconds=0.0, result=lambda path: "installed"):
        self.seconds, self.result = seconds, result
        self.calls, self.active, self.overlap = [], 0, False
        self._lock = threading.Lock()

    def __call__(self, path, digest=None):
        with self._lock:
            self.active += 1
            self.overlap |= self.active > 1
        try:
            self.calls.append(hashlib.sha256(path.read_bytes()).hexdigest())
            time.sleep(self.seconds)
            return self.result(path)
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "bundles"
    path.mkdir()
    return path


@pytest.fixture
def watch(folder):
    started = []

    def start(install, **options):
        watcher = BundleWatcher(folder, install, **{"debounce_s": 0.1, "check_s": 0.2, **options})
        watcher.start()
        started.append(watcher)
        return watcher

    yield start
    for watcher in started:
        watcher.stop()


def first_scan_done(watcher):
    """Wait for the first scan, of the empty folder, to end."""
    assert wait_for(lambda: watcher.scans == 1)
    time.sleep(0.3)


def drop(path, data):
    """Put a bundle in place in one rename, as a careful writer does."""
    tmp = path.parent.parent / f"staged-{path.name}"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def test_a_burst_of_changes_installs_the_bundle_once(folder, watch):
    installs = Installs(seconds=0.3)  # slow: scans that overlapped would install it twice
    watcher = watch(installs)
    data = os.urandom(2**20)
    digest = drop(folder / "good.tgz", data)
    for i in range(8):  # events more than a debounce period apart: scans during the burst
        (folder / "notes.txt").write_text(str(i))
        os.replace(folder / "notes.txt", folder / f"notes-{i % 2}.txt")
        os.utime(folder / "good.tgz")  # a touch
        (folder / "good.tgz").read_bytes()  # someone reading it
        stamp = folder / f"..2026_11_21_10_00_00.00000000{i}"  # a ConfigMap swap, same bundle
        stamp.mkdir()
        (stamp / "fleet.tgz").write_bytes(data)
        (folder / "..data_tmp").symlink_to(stamp.name)
        os.replace(folder / "..data_tmp", folder / "..data")
        if i == 0:
            (folder / "fleet.tgz").symlink_to("..data/fleet.tgz")
        time.sleep(0.15)
    assert wait_for(lambda: installs.calls)
    time.sleep(1.5)  # many debounce periods and periodic checks later
    assert installs.calls == [digest] and not installs.overlap
    assert watcher.seen == {digest: "installed"}


def test_concurrent_triggers_never_scan_at_once(folder, watch):
    digests = {drop(folder / f"b{i}.tgz", os.urandom(4096)) for i in range(4)}
    installs = Installs(seconds=0.1)
    watcher = watch(installs)
    callers = [threading.Thread(target=watcher.scan) for _ in range(4)]
    for caller in callers:
        caller.start()
    digests |= {drop(folder / f"c{i}.tgz", os.urandom(4096)) for i in range(2)}  # events too
    for caller in callers:
        caller.join()
    assert wait_for(lambda: len(installs.calls) == 6)
    time.sleep(0.5)
    assert sorted(installs.calls) == sorted(digests) and not installs.overlap


def test_an_event_during_a_scan_brings_exactly_one_more_scan(folder, watch):
    installs = Installs(seconds=0.6)
    watcher = watch(installs, check_s=60.0)  # events only
    first_scan_done(watcher)
    first = drop(folder / "a.tgz", b"a" * 4096)
    assert wait_for(lambda: installs.active == 1)
    second = drop(folder / "b.tgz", b"b" * 4096)  # while a.tgz installs, with more events
    for i in range(10):
        (folder / "notes.txt").write_text(str(i))
    assert wait_for(lambda: len(installs.calls) == 2)
    time.sleep(0.5)
    assert installs.calls == [first, second] and watcher.scans == 3 and not installs.overlap


def test_a_deferred_bundle_is_retried_when_what_it_waits_for_changes(tmp_path, folder, watch):
    status = tmp_path / "status.json"
    installs = Installs(result=lambda path: "installed" if status.exists() else "deferred")
    watcher = watch(installs, retry_on=[status])
    first_scan_done(watcher)
    digest = drop(folder / "early.tgz", os.urandom(4096))
    assert wait_for(lambda: watcher.seen == {digest: "deferred"})
    time.sleep(0.6)  # periodic checks: nothing changed, nothing retried
    assert len(installs.calls) == 1
    status.write_text("{}")
    assert wait_for(lambda: watcher.seen == {digest: "installed"})
    assert len(installs.calls) == 2


def test_a_failing_install_counts_as_rejected_and_the_watcher_goes_on(folder, watch):
    def install(path, digest):
        if path.name == "bad.tgz":
            raise RuntimeError("boom")
        return "installed"

    watcher = watch(install)
    bad = drop(folder / "bad.tgz", b"bad")
    good = drop(folder / "good.tgz", b"good")
    assert wait_for(lambda: watcher.seen == {bad: "rejected", good: "installed"})


def test_a_bundle_is_hashed_by_streaming_and_once(folder, monkeypatch):
    (folder / "big.tgz").write_bytes(b"\0" * (32 * 2**20))
    (folder / ".tmp-123-partial.tgz").write_bytes(b"half")  # a writer's temp file: not a bundle
    installs = []
    watcher = BundleWatcher(folder, lambda path, digest: installs.append(path.name) or "rejected")
    tracemalloc.start()
    try:
        watcher.scan()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert installs == ["big.tgz"] and peak < 8 * 2**20
    hashed = []
    monkeypatch.setattr(hashlib, "sha256", lambda *a: hashed.append(a) or hashlib.new("sha256"))
    watcher.scan()  # unchanged: known by its stat, not hashed again
    assert hashed == [] and installs == ["big.tgz"] and watcher.scans == 2


def test_a_bundle_rewritten_in_place_with_its_old_mtime_is_installed(folder, watch):
    installs = Installs()
    watcher = watch(installs)
    first_scan_done(watcher)
    path = folder / "fleet.tgz"
    drop(path, b"a" * 4096)
    assert wait_for(lambda: len(installs.calls) == 1)
    before = path.stat()
    with path.open("r+b") as f:  # rsync --inplace -t, cp -p: same size, same mtime
        f.write(b"b" * 4096)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert wait_for(lambda: len(installs.calls) == 2)  # once: never seen again
    assert installs.calls[1] == hashlib.sha256(b"b" * 4096).hexdigest()


def test_a_deferred_bundle_is_retried_now_and_then_without_a_change(folder, watch, monkeypatch):
    monkeypatch.setattr(watcher_module, "DEFERRED_RETRY_S", 0.5)
    answers = iter(["deferred", "installed"])  # a store that was busy, then took it
    installs = Installs(result=lambda path: next(answers))
    watcher = watch(installs)
    first_scan_done(watcher)
    digest = drop(folder / "fleet.tgz", os.urandom(4096))
    assert wait_for(lambda: watcher.seen.get(digest) == "installed", timeout=5)


def test_a_fifo_named_like_a_bundle_never_blocks_a_scan(folder, watch):
    os.mkfifo(folder / "trap.tgz")
    installs = Installs()
    watcher = watch(installs)
    digest = drop(folder / "real.tgz", os.urandom(4096))
    assert wait_for(lambda: watcher.seen.get(digest) == "installed", timeout=5)
    assert len(installs.calls) == 1


def test_a_configmaps_links_are_followed_inside_the_folder(folder, watch):
    stamp = folder / "..2026_11_21_10_00_00.000000001"
    stamp.mkdir()
    data = os.urandom(4096)
    (stamp / "fleet.tgz").write_bytes(data)
    (folder / "..data").symlink_to(stamp.name)
    (folder / "fleet.tgz").symlink_to("..data/fleet.tgz")
    (folder / "abs.tgz").symlink_to(stamp / "fleet.tgz")  # absolute, still inside
    installs = Installs()
    watcher = watch(installs)
    digest = hashlib.sha256(data).hexdigest()
    assert wait_for(lambda: watcher.seen.get(digest) == "installed")
    assert installs.calls == [digest]


def test_a_link_out_of_the_folder_is_skipped_with_one_warning_and_never_opened(
    tmp_path, folder, monkeypatch, caplog
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "other.tgz").write_bytes(os.urandom(4096))
    (folder / "other.tgz").symlink_to(elsewhere / "other.tgz")  # a bundle elsewhere
    (folder / "passwd.tgz").symlink_to("/etc/passwd")
    (folder / "..data").symlink_to(elsewhere)  # a ConfigMap's layout, led out
    (folder / "fleet.tgz").symlink_to("..data/other.tgz")
    (folder / "escape.tgz").symlink_to("../elsewhere/other.tgz")
    opened = []
    real_open = os.open
    monkeypatch.setattr(
        watcher_module.os, "open", lambda path, *a: opened.append(str(path)) or real_open(path, *a)
    )
    installs = []
    watcher = BundleWatcher(folder, lambda path, digest: installs.append(path.name) or "installed")
    digest = drop(folder / "real.tgz", os.urandom(4096))
    for _ in range(3):
        watcher.scan()
    assert installs == ["real.tgz"] and watcher.seen == {digest: "installed"}
    assert opened == [str(folder / "real.tgz")]  # nothing outside was opened
    skipped = [r.getMessage() for r in caplog.records if "outside the folder" in r.getMessage()]
    assert len(skipped) == 4  # one each, not one a scan
    assert any("passwd.tgz is a link to /etc/passwd" in line for line in skipped)


def test_a_link_moved_out_after_the_listing_is_not_installed(tmp_path, folder):
    inside = folder / "..2026_11_21_10_00_00.000000001"
    inside.mkdir()
    (inside / "b.tgz").write_bytes(os.urandom(4096))
    (folder / "b.tgz").symlink_to(inside / "b.tgz")
    installs = []
    watcher = BundleWatcher(folder, lambda path, digest: installs.append(path.name) or "installed")
    listing = watcher._listing()  # the link led inside when the folder was listed
    (tmp_path / "out.tgz").write_bytes(os.urandom(4096))
    (folder / "b.tgz").unlink()
    (folder / "b.tgz").symlink_to(tmp_path / "out.tgz")
    assert watcher.scan(listing) == {} and installs == []
