import errno
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry import Entry, MatchPolicy, RegistryError, Store
from registry.core import atomic
from registry.core.entry import SCHEMA_VERSION
from registry.storage.store import CURRENT, QUARANTINE
from tests.conftest import gpu_fingerprint
from tests.registry import _workers

KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}


def test_put_then_lookup_is_exact_by_default(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    stored = store.put(make_entry())
    assert store.lookup("ag_gemm", KEY, h200) == stored
    assert store.lookup("ag_gemm", {**KEY, "M": 8}, h200) is None
    assert store.lookup("other", KEY, h200) is None
    assert (tmp_path / CURRENT / stored.relpath()).is_file()


def test_policy_decides_whether_another_gpu_matches(tmp_path, make_entry):
    h100 = gpu_fingerprint("NVIDIA H100", sms=114)
    h200 = gpu_fingerprint()
    store = Store(tmp_path)
    store.put(make_entry(fp=h100))
    assert store.lookup("ag_gemm", KEY, h200) is None
    assert store.explain_miss("ag_gemm", KEY, h200) == [
        {"hardware.gpu_name": ("NVIDIA H200", "NVIDIA H100"), "hardware.sm_count": (132, 114)}
    ]
    assert store.lookup("ag_gemm", KEY, h200, MatchPolicy.SAME_ARCH) is not None
    a100 = gpu_fingerprint("NVIDIA A100", cc="8.0")
    assert store.lookup("ag_gemm", KEY, a100, MatchPolicy.SAME_ARCH) is None
    assert store.lookup("ag_gemm", KEY, a100, MatchPolicy.ANY) is not None


def test_exact_match_preferred_over_a_forgiven_one(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    store.put(make_entry(fp=gpu_fingerprint("NVIDIA H100", sms=114), block_m=32))
    store.put(make_entry(fp=h200, block_m=256))
    found = store.lookup("ag_gemm", KEY, h200, MatchPolicy.SAME_ARCH)
    assert found.best.meta["BLOCK_M"] == 256


def test_a_reader_notices_another_writer(tmp_path, make_entry, h200):
    reader, writer = Store(tmp_path), Store(tmp_path)
    assert reader.lookup("ag_gemm", KEY, h200) is None
    writer.put(make_entry())
    assert reader.lookup("ag_gemm", KEY, h200) is not None
    assert not reader.refresh()  # nothing changed since: no reload


def test_check_interval_bounds_how_often_readers_look(tmp_path, make_entry, h200):
    reader = Store(tmp_path, check_interval=3600)
    assert reader.lookup("ag_gemm", KEY, h200) is None
    Store(tmp_path).put(make_entry())
    assert reader.lookup("ag_gemm", KEY, h200) is None  # within the interval: cached view
    reader.refresh(force=True)
    assert reader.lookup("ag_gemm", KEY, h200) is not None


def test_replayed_put_is_idempotent(tmp_path, make_entry):
    store = Store(tmp_path)
    entry = make_entry()
    first = store.put(entry)
    path = tmp_path / CURRENT / entry.relpath()
    mtime = path.stat().st_mtime_ns
    assert store.put(entry) == first
    assert path.stat().st_mtime_ns == mtime  # nothing rewritten


@pytest.mark.parametrize(
    "content",
    [b"", b'{"schema": 1, "kernel": "ag_', b"\x00\xff garbage", b'{"schema": 1}', b"[1, 2, 3]"],
)
def test_corrupt_file_is_quarantined_and_becomes_a_miss(tmp_path, make_entry, h200, content):
    store = Store(tmp_path)
    entry = store.put(make_entry())
    good = store.put(make_entry(m=8192))
    path = tmp_path / CURRENT / entry.relpath()
    path.write_bytes(content)
    reader = Store(tmp_path)
    assert reader.lookup("ag_gemm", KEY, h200) is None
    assert reader.lookup("ag_gemm", {**KEY, "M": 8192}, h200) == good
    assert reader.quarantined == 1 and not path.exists()
    moved = list((tmp_path / QUARANTINE).iterdir())
    assert {p.suffix for p in moved} == {".json", ".reason"}
    assert reader.put(make_entry()).relpath() == entry.relpath()  # the slot is writable again


def test_entry_from_a_newer_schema_is_skipped_not_quarantined(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    entry = store.put(make_entry())
    path = tmp_path / CURRENT / entry.relpath()
    data = json.loads(path.read_text())
    data["schema"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    reader = Store(tmp_path)
    assert reader.lookup("ag_gemm", KEY, h200) is None
    assert reader.skipped == 1 and reader.quarantined == 0 and path.exists()


def test_sixteen_processes_writing_at_once_lose_nothing(tmp_path):
    workers, count = 16, 5
    start = time.time() + 2.0  # every process is started and waiting when the gun fires
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_workers.write_entries, args=(str(tmp_path), w, count, start))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * workers
    store = Store(tmp_path)
    entries = store.entries()
    assert len(entries) == workers * count + 1
    shared = store.lookup(
        "ag_gemm", {"M": _workers.SHARED_M, "N": 256, "K": 128}, gpu_fingerprint()
    )
    assert sorted(m.config.meta["BLOCK_M"] for m in shared.measurements) == list(range(1, 17))
    assert shared.best.meta["BLOCK_M"] == 1  # the earliest tuning wins, whatever the order
    assert store.quarantined == 0


def test_a_writer_killed_mid_stream_leaves_a_usable_store(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.registry._workers", "write_forever", str(tmp_path)],
        cwd=Path(__file__).parents[3],
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(Store(tmp_path)) < 20:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = Store(tmp_path)
    written = len(store)
    assert written >= 20 and store.quarantined == 0
    store.put(_workers.entry(10**6, 64))
    assert len(Store(tmp_path)) == written + 1


def test_a_crashed_install_leaves_nothing_behind(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    store.put(make_entry())
    current = os.readlink(tmp_path / CURRENT)
    half = tmp_path / "gen-000099"  # what an install killed before its swap leaves
    (half / "ag_gemm").mkdir(parents=True)
    (half / "ag_gemm" / "x.json").write_text("{")
    (tmp_path / CURRENT).parent.joinpath(".tmp-123-current").write_text("")
    reader = Store(tmp_path)
    assert len(reader) == 1 and reader.quarantined == 0
    assert os.readlink(tmp_path / CURRENT) == current
    reader.install([make_entry(m=1)], record={"bundle": {"name": "b"}})
    assert not half.exists()  # the unsealed generation was collected
    assert len(reader) == 2


def test_install_swaps_generations_and_rollback_undoes_only_the_bundle(tmp_path, make_entry, h200):
    store = Store(tmp_path)
    before = store.put(make_entry(m=1, block_m=64))
    store.install(
        [make_entry(m=1, block_m=32, created="2026-01-01T00:00:00+00:00"), make_entry(m=2)],
        record={"bundle": {"name": "b1", "version": "1"}},
    )
    assert store.lookup("ag_gemm", {**KEY, "M": 1}, h200).best.meta["BLOCK_M"] == 32
    tuned_after = store.put(make_entry(m=3))  # a tuning after the install survives rollback
    info = store.rollback()
    assert info["kind"] == "rollback"
    assert store.lookup("ag_gemm", {**KEY, "M": 1}, h200) == before
    assert store.lookup("ag_gemm", {**KEY, "M": 2}, h200) is None
    assert store.lookup("ag_gemm", {**KEY, "M": 3}, h200) == tuned_after
    listed = store.generations()  # typed records, oldest first, the current one marked
    assert [g.current for g in listed] == [False] * (len(listed) - 1) + [True]
    assert listed[-1].record == store.record() and listed[-1].record.kind == "rollback"
    (install,) = [g for g in listed if g.record.kind == "install"]
    assert install.bundle == {"name": "b1", "version": "1"} and install.record.changed


def test_rollback_without_an_install_is_a_clear_error(tmp_path, make_entry):
    store = Store(tmp_path)
    store.put(make_entry())
    with pytest.raises(Exception, match="no bundle install left to roll back"):
        store.rollback()


def test_old_generations_are_collected_but_current_kept(tmp_path, make_entry):
    store = Store(tmp_path, keep_generations=3)
    for i in range(6):
        store.install([make_entry(m=i)], record={"bundle": {"name": f"b{i}"}})
    gens = sorted(p.name for p in tmp_path.glob("gen-*"))
    assert len(gens) <= 4 and os.readlink(tmp_path / CURRENT) == gens[-1]
    assert len(store) == 6


def test_empty_store_reads_as_empty(tmp_path, h200):
    assert Store(tmp_path).lookup("ag_gemm", KEY, h200) is None
    assert Store(tmp_path).entries() == []


def test_a_missing_store_is_an_error_naming_the_path_and_creates_nothing(tmp_path):
    missing = tmp_path / "nowhere" / "registry"
    with pytest.raises(RegistryError, match=r"nowhere/registry' does not exist.*create=True"):
        Store(missing)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RegistryError, match="is not a folder"):
        Store(tmp_path / "file")
    assert not (tmp_path / "nowhere").exists()


def test_create_makes_the_store_at_its_first_write_only(tmp_path, make_entry, h200):
    root = tmp_path / "new" / "registry"
    store = Store(root, create=True)
    assert store.entries() == [] and not (tmp_path / "new").exists()  # a read makes nothing
    store.put(make_entry())
    assert len(Store(root)) == 1


def test_a_store_removed_after_opening_is_not_made_again(tmp_path, make_entry):
    root = tmp_path / "registry"
    root.mkdir()
    store = Store(root)
    root.rmdir()
    with pytest.raises(RegistryError, match="does not exist"):
        store.put(make_entry())
    assert not root.exists()


def test_entry_kernel_name_validation_guards_the_path(make_entry):
    with pytest.raises(Exception, match="Kernel name"):
        make_entry(kernel="../../etc/passwd")
    assert isinstance(make_entry(kernel="my_pkg.mod:fn"), Entry)


def _ten_entries(root, make_entry):
    store = Store(root, create=True)
    store.put_many([make_entry(m=m) for m in range(1, 11)])
    return store


WRONG_TYPED = {
    "measurements a list of ints": lambda d: d.update(measurements=[1]),
    "measurements an int": lambda d: d.update(measurements=5),
    "an int compute capability": lambda d: d["fingerprint"]["hardware"].update(
        compute_capability=9
    ),
    "a deep nest": lambda d: d.update(key={"M": "DEEP"}),
    "a 400-digit time": lambda d: d.update(tuning_seconds=10**400),  # once: OverflowError
    "a 400-digit median": lambda d: d["measurements"][0].update(median_ms=10**400),
}


@pytest.mark.parametrize("spoil", WRONG_TYPED.values(), ids=WRONG_TYPED.keys())
def test_a_wrong_typed_entry_is_quarantined_and_the_store_goes_on(
    tmp_path, make_entry, h200, spoil
):
    _ten_entries(tmp_path, make_entry)
    path = tmp_path / CURRENT / make_entry(m=1).relpath()
    data = json.loads(path.read_text())
    spoil(data)
    path.write_text(json.dumps(data).replace('"DEEP"', "[" * 50_000 + "]" * 50_000))
    reader = Store(tmp_path)
    assert reader.lookup("ag_gemm", {**KEY, "M": 1}, h200) is None
    assert all(reader.lookup("ag_gemm", {**KEY, "M": m}, h200) for m in range(2, 11))
    assert reader.quarantined == 1 and not path.exists()
    reasons = [p.read_text() for p in (tmp_path / QUARANTINE).glob("*.reason")]
    assert len(reasons) == 1 and reasons[0]
    assert reader.put(make_entry(m=1)).key["M"] == 1  # a put reports what it stored
    reader.install([make_entry(m=11)], record={"bundle": {"name": "b"}})
    assert len(Store(tmp_path)) == 11


def test_a_missing_generation_record_is_resealed_not_replaced_by_an_empty_one(tmp_path, make_entry):
    store = _ten_entries(tmp_path, make_entry)
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    (gen / "GENERATION.json").unlink()
    assert len(Store(tmp_path)) == 10  # readers see every entry meanwhile
    store.put(make_entry(m=11))
    assert len(Store(tmp_path)) == 11  # once: 10 entries became 1
    assert store.record().kind == "repair"
    store.install([make_entry(m=12)], record={"bundle": {"name": "b"}})
    store.install([make_entry(m=13)], record={"bundle": {"name": "c"}})
    assert len(Store(tmp_path)) == 13  # once: the next install deleted the old generation


@pytest.mark.parametrize("record", [b"{", b'{"id": 5}', b"[]", b'{"id": "gen-000001"}'])
def test_a_broken_generation_record_is_resealed(tmp_path, make_entry, record):
    store = _ten_entries(tmp_path, make_entry)
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    (gen / "GENERATION.json").write_bytes(record)
    store.put(make_entry(m=11))
    assert len(Store(tmp_path)) == 11 and store.record().kind == "repair"
    kept = [p for p in (tmp_path / QUARANTINE).iterdir() if p.suffix == ".json"]
    assert [p.read_bytes() for p in kept] == [record]  # the broken record is kept aside


BREAK_CURRENT = {
    "missing": lambda link: link.unlink(),
    "dangling": lambda link: (link.unlink(), link.symlink_to("gen-000099")),
    "a link to a stray": lambda link: (link.unlink(), link.symlink_to("/etc")),
    "a regular file": lambda link: (link.unlink(), link.write_text("gen-000001")),
    "a copied folder": lambda link: _replace_link_with_copy(link),
}


def _replace_link_with_copy(link):
    target = link.resolve()
    link.unlink()
    shutil.copytree(target, link)
    shutil.rmtree(target)  # a copy tool that followed the link, then a cleanup


@pytest.mark.parametrize("spoil", BREAK_CURRENT.values(), ids=BREAK_CURRENT.keys())
def test_a_broken_current_link_hides_nothing_and_is_repaired(tmp_path, make_entry, h200, spoil):
    store = _ten_entries(tmp_path, make_entry)
    store.install([make_entry(m=11)], record={"bundle": {"name": "b"}})
    spoil(tmp_path / CURRENT)
    assert len(Store(tmp_path)) == 11  # a reader sees every entry before any repair
    store.put(make_entry(m=12))
    assert (tmp_path / CURRENT).is_symlink()
    reader = Store(tmp_path)
    assert len(reader) == 12 and reader.quarantined == 0
    assert reader.lookup("ag_gemm", {**KEY, "M": 11}, h200) is not None


def test_recover_cleans_temp_files_and_unsealed_generations(tmp_path, make_entry):
    store = _ten_entries(tmp_path, make_entry)
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    (gen / "ag_gemm" / ".tmp-abc-x.json").write_text("{")  # what kill -9 mid-write leaves
    (tmp_path / ".tmp-77-current").symlink_to("gen-000001")
    crashed = tmp_path / "gen-000050"  # an install killed before its seal: links only
    store._generations.fork(gen).rename(crashed)
    unique = tmp_path / "gen-000051"  # unsealed, holding an entry nobody else has
    (unique / "ag_gemm").mkdir(parents=True)
    (unique / "ag_gemm" / "lone.json").write_text(atomic.dumps(make_entry(m=99).to_json()))
    report = Store(tmp_path).recover()
    assert sorted(report["temp_files"]) == [
        ".tmp-77-current",
        f"{gen.name}/ag_gemm/.tmp-abc-x.json",
    ]
    assert report["generations"] == {"removed": ["gen-000050"], "quarantined": ["gen-000051"]}
    assert not crashed.exists() and not unique.exists()
    assert list((tmp_path / QUARANTINE).glob("*gen-000051-never-current/ag_gemm/lone.json"))
    assert len(Store(tmp_path)) == 10
    assert Store(tmp_path).recover() == {
        "repaired": "",
        "temp_files": [],
        "generations": {"removed": [], "quarantined": []},
    }


def test_no_generation_holding_entries_the_current_lacks_is_deleted(tmp_path, make_entry):
    store = Store(tmp_path, keep_generations=2)
    store.put_many([make_entry(m=m) for m in range(1, 4)])
    first = tmp_path / os.readlink(tmp_path / CURRENT)
    store.install([make_entry(m=4)], record={"bundle": {"name": "b"}})
    current = tmp_path / os.readlink(tmp_path / CURRENT)
    (current / make_entry(m=1).relpath()).unlink()  # lost from current by hand
    for i in range(5):
        store.install([make_entry(m=10 + i)], record={"bundle": {"name": f"c{i}"}})
    assert first.exists()  # the only generation still holding M=1
    assert len(list(tmp_path.glob("gen-*"))) <= 2 + 2


def test_a_rolled_back_install_is_collected_once_out_of_the_window(tmp_path, make_entry):
    store = Store(tmp_path, keep_generations=2)
    store.put(make_entry(m=1))
    store.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    installed = tmp_path / os.readlink(tmp_path / CURRENT)
    store.rollback()
    for i in range(3):
        store.install([make_entry(m=10 + i)], record={"bundle": {"name": f"c{i}"}})
    assert not installed.exists()  # only the undone bundle's entry was lacking


@pytest.mark.parametrize("kind", ["fifo", "huge", "symlink"])
def test_an_entry_path_that_is_no_small_regular_file_is_quarantined(
    tmp_path, make_entry, h200, kind
):
    _ten_entries(tmp_path, make_entry)
    path = tmp_path / CURRENT / make_entry(m=1).relpath()
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # a read would block forever
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(64 * 2**20)
    else:
        path.symlink_to("/dev/zero")
    reader = Store(tmp_path)
    assert len(reader) == 9 and reader.quarantined == 1


def test_a_rollback_never_reports_success_without_the_entry_it_restores(tmp_path, make_entry, h200):
    store = Store(tmp_path, keep_generations=2)
    tuned = store.put(make_entry(m=1, block_m=128))
    earlier = make_entry(m=1, block_m=64, created="2026-01-01T00:00:00+00:00")  # wins the merge
    store.install([earlier], record={"bundle": {"name": "b"}})
    assert store.lookup("ag_gemm", {**KEY, "M": 1}, h200).best.meta["BLOCK_M"] == 64
    store.install([make_entry(m=2)], record={"bundle": {"name": "c"}})
    store.rollback()  # undoes c
    try:
        store.rollback()  # undoes b: its parent may have left the kept window
    except RegistryError:  # the kept window is too short for it: said, and nothing changed
        assert store.lookup("ag_gemm", {**KEY, "M": 1}, h200).best.meta["BLOCK_M"] == 64
    else:  # once: the parent was collected inside the rollback and the entry unlinked
        assert store.lookup("ag_gemm", {**KEY, "M": 1}, h200) == tuned


def test_a_parent_chain_that_loops_is_no_chain(tmp_path, make_entry):
    store = Store(tmp_path)
    store.put(make_entry())
    store.install([make_entry(m=1)], record={"bundle": {"name": "b"}})
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    record = json.loads((gen / "GENERATION.json").read_text())
    (gen / "GENERATION.json").write_text(json.dumps({**record, "parent": gen.name}))
    with pytest.raises(RegistryError, match="repaired"):  # once: looped forever under the lock
        store.rollback()
    assert len(Store(tmp_path)) == 2


def test_an_install_whose_swap_failed_is_never_taken_for_current(
    tmp_path, make_entry, h200, monkeypatch
):
    store = _ten_entries(tmp_path, make_entry)

    def full_disk(link, target):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(atomic, "replace_symlink", full_disk)
        with pytest.raises(OSError):
            store.install([make_entry(m=20)], record={"bundle": {"name": "b"}})
    store.put(make_entry(m=11))  # puts go on into the real current
    (tmp_path / CURRENT).unlink()
    reader = Store(tmp_path)
    assert reader.lookup("ag_gemm", {**KEY, "M": 11}, h200) is not None
    assert reader.lookup("ag_gemm", {**KEY, "M": 20}, h200) is None


def test_a_crashed_install_sealed_but_never_swapped_loses_to_the_generation_in_use(
    tmp_path, make_entry, h200
):
    store = _ten_entries(tmp_path, make_entry)
    current = tmp_path / os.readlink(tmp_path / CURRENT)
    stale = store._generations.fork(current)  # what a kill between seal and swap leaves
    store._generations.seal(stale, current, {"kind": "install", "changed": []})
    old = time.time() - 60
    os.utime(stale / ".stamp", (old, old))
    store.put(make_entry(m=11))
    (tmp_path / CURRENT).unlink()
    assert Store(tmp_path).lookup("ag_gemm", {**KEY, "M": 11}, h200) is not None
    report = Store(tmp_path).recover()
    assert report["generations"]["removed"] == [stale.name]  # it held nothing current lacks


def test_a_put_onto_a_corrupt_or_newer_file_keeps_what_it_must(tmp_path, make_entry, h200):
    store = _ten_entries(tmp_path, make_entry)
    path = tmp_path / CURRENT / make_entry(m=1).relpath()
    path.write_text("{")
    store.put(make_entry(m=1))
    assert store.quarantined == 1 and list((tmp_path / QUARANTINE).glob("*.reason"))
    newer = {**json.loads(path.read_text()), "schema": SCHEMA_VERSION + 1, "future": True}
    path.write_text(json.dumps(newer))
    store.put(make_entry(m=1))
    assert json.loads(path.read_text())["future"] is True  # a newer version's entry stays


def test_a_read_that_fails_fails_the_put_instead_of_overwriting(tmp_path, make_entry, monkeypatch):
    store = _ten_entries(tmp_path, make_entry)
    path = tmp_path / CURRENT / make_entry(m=1).relpath()
    before = path.read_bytes()

    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("registry.storage.entry_writer.read_entry", eio)
    with pytest.raises(OSError):
        store.put(make_entry(m=1, block_m=32))
    assert path.read_bytes() == before


def test_a_passing_read_error_hides_an_entry_only_until_the_next_reload(
    tmp_path, make_entry, monkeypatch
):
    _ten_entries(tmp_path, make_entry)
    reader = Store(tmp_path)
    real = atomic.read_bounded
    calls = []

    def flaky(path, limit, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, limit, **kwargs)

    monkeypatch.setattr(atomic, "read_bounded", flaky)
    assert len(reader) == 9 and reader.quarantined == 0
    reader.refresh(force=True)
    assert len(reader) == 10 and not (tmp_path / QUARANTINE).exists()


@pytest.mark.parametrize(
    "obstacle", ["quarantine file", "kernel file", "entry folder", "lock folder"]
)
def test_a_stray_object_never_blocks_writes(tmp_path, make_entry, h200, obstacle):
    store = _ten_entries(tmp_path, make_entry)
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    new = make_entry(m=1, kernel="other")
    if obstacle == "quarantine file":
        (tmp_path / QUARANTINE).write_text("x")
        (gen / "GENERATION.json").unlink()  # a reseal moves the broken record aside
    elif obstacle == "kernel file":
        (gen / "other").write_text("x")
    elif obstacle == "entry folder":
        (gen / new.relpath()).mkdir(parents=True)
    else:
        (tmp_path / ".store.lock").unlink()
        (tmp_path / ".store.lock").mkdir()
    store.put(new)
    assert Store(tmp_path).lookup("other", {**KEY, "M": 1}, h200) == new


def test_a_rollback_stops_at_a_repaired_generation(tmp_path, make_entry):
    store = Store(tmp_path)
    store.put(make_entry())
    store.install([make_entry(m=1)], record={"bundle": {"name": "a"}})
    store.install([make_entry(m=2)], record={"bundle": {"name": "b"}})
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    (gen / "GENERATION.json").unlink()  # b's record, and what it changed, are lost
    with pytest.raises(RegistryError, match="repaired"):  # once: it undid bundle a instead
        store.rollback()
    assert len(Store(tmp_path)) == 3


def test_quarantined_files_never_overwrite_each_other(tmp_path, make_entry):
    store = _ten_entries(tmp_path, make_entry)
    path = tmp_path / CURRENT / make_entry(m=1).relpath()
    for content in ("{", "[", "x"):
        path.write_text(content)
        Store(tmp_path).entries()
    kept = sorted(p.read_text() for p in (tmp_path / QUARANTINE).iterdir() if p.suffix == ".json")
    assert kept == ["[", "x", "{"] and store.quarantined_files() == 3


def test_a_stray_name_like_a_generation_breaks_nothing(tmp_path, make_entry):
    store = _ten_entries(tmp_path, make_entry)
    (tmp_path / "gen-²").write_text("x")
    (tmp_path / "gen-000009\n").mkdir()
    store.install([make_entry(m=11)], record={"bundle": {"name": "b"}})
    assert len(Store(tmp_path)) == 11


def test_install_runs_after_swap_under_the_lock_before_garbage_collection(tmp_path, make_entry):
    events = []

    class Watching(Store):
        def _collect_garbage(self):
            events.append("gc")
            return super()._collect_garbage()

    store = Watching(tmp_path)
    store.put(make_entry())

    def after_swap():
        current = os.readlink(tmp_path / CURRENT)
        events.append(("after_swap", current, store._lock.is_locked))

    events.clear()
    info = store.install([make_entry(m=1)], record={"bundle": {"name": "b"}}, after_swap=after_swap)
    assert events[-2:] == [("after_swap", info["id"], True), "gc"]


def test_a_failing_after_swap_keeps_the_swap_and_is_logged(tmp_path, make_entry, caplog):
    store = Store(tmp_path)

    def after_swap():
        raise OSError("disk full")

    info = store.install([make_entry(m=1)], record={"bundle": {"name": "b"}}, after_swap=after_swap)
    assert os.readlink(tmp_path / CURRENT) == info["id"] and len(Store(tmp_path)) == 1
    assert "disk full" in caplog.text


def _hang_in(root, what, tmp_path):
    """A writer process stopped mid-``what`` (its temp file written, not yet renamed),
    then killed -9, as a pod is."""
    ready = tmp_path / f"ready-{what}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.registry._workers", "hang_in", str(root), what, str(ready)],
        cwd=Path(__file__).parents[3],
    )
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, f"no {what} started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _recovery_lines(caplog):
    return [r.getMessage() for r in caplog.records if "killed writers left" in r.getMessage()]


@pytest.mark.parametrize("what", ["put", "install"])
def test_the_next_put_clears_what_a_writer_killed_mid_write_left(
    tmp_path, make_entry, h200, caplog, what
):
    root = tmp_path / "registry"
    _ten_entries(root, make_entry)
    _hang_in(root, what, tmp_path)
    assert len(list(root.rglob(".tmp-*"))) == 1
    unsealed = [g for g in root.glob("gen-*") if not (g / "GENERATION.json").exists()]
    assert len(unsealed) == (what == "install")
    store = Store(root)
    with caplog.at_level("WARNING", logger="registry.storage.store"):
        store.put(make_entry(m=11))
    assert not list(root.rglob(".tmp-*")) and not any(g.exists() for g in unsealed)
    removed = {"generations_removed": 1} if unsealed else {}
    assert store.recovered == {"temp_files": 1, **removed}
    (line,) = _recovery_lines(caplog)
    assert "1 temp files" in line and f"removed {[g.name for g in unsealed]}" in line
    assert len(Store(root)) == 11
    store.put(make_entry(m=12))  # once per writer: nothing more to say
    assert len(_recovery_lines(caplog)) == 1


def test_twenty_five_unsealed_generations_are_cleared_by_one_put(
    tmp_path, make_entry, h200, caplog
):
    store = _ten_entries(tmp_path, make_entry)
    current = tmp_path / os.readlink(tmp_path / CURRENT)
    for i in range(25):  # installs killed before their seal: links, and a few new entries
        crashed = store._generations.fork(current)
        if i % 5 == 0:
            (crashed / "ag_gemm" / f"lone-{i}.json").write_text(
                atomic.dumps(make_entry(m=1000 + i).to_json())
            )
    writer = Store(tmp_path)
    with caplog.at_level("WARNING", logger="registry.storage.store"):
        writer.put(make_entry(m=11))
    assert [g.name for g in tmp_path.glob("gen-*")] == [current.name]
    assert writer.recovered == {"generations_removed": 20, "generations_quarantined": 5}
    assert len(list((tmp_path / QUARANTINE).glob("*-never-current.reason"))) == 5
    assert len(_recovery_lines(caplog)) == 1 and len(Store(tmp_path)) == 11


def test_clearing_debris_stops_at_its_budget_and_goes_on_at_the_next_write(
    tmp_path, make_entry, caplog
):
    store = _ten_entries(tmp_path, make_entry)
    folder = tmp_path / CURRENT / "ag_gemm"
    for i in range(3):
        (folder / f".tmp-{i}-x.json").write_text("{")
    writer = Store(tmp_path, recovery_budget_s=0.0)  # one file or folder per write
    with caplog.at_level("WARNING", logger="registry.storage.store"):
        for m in range(11, 40):
            writer.put(make_entry(m=m))
    assert not list(folder.glob(".tmp-*")) and writer.recovered == {"temp_files": 3}
    lines = _recovery_lines(caplog)
    assert len(lines) == 3 and all("the rest at the next write" in line for line in lines[:2])
    assert len(store) == 39 and writer._recovery.cleared


@pytest.mark.parametrize(
    "obstacle",
    [
        ".stamp folder",
        ".stamp fifo",
        "GENERATION.json folder",
        "GENERATION.json fifo",
        "current fifo",
        "lock folder",
        "entry fifo",
    ],
)
def test_a_folder_or_fifo_where_a_marker_belongs_is_quarantined_and_puts_go_on(
    tmp_path, make_entry, h200, obstacle
):
    store = _ten_entries(tmp_path, make_entry)
    gen = tmp_path / os.readlink(tmp_path / CURRENT)
    new = make_entry(m=1, kernel="other")
    name, kind = obstacle.split()
    spot = {"current": tmp_path / CURRENT, "lock": tmp_path / ".store.lock"}.get(name, gen / name)
    if name == "entry":
        spot = gen / new.relpath()
        spot.parent.mkdir(parents=True)
    spot.unlink(missing_ok=True)
    spot.mkdir() if kind == "folder" else os.mkfifo(spot)
    store.put(new)
    assert Store(tmp_path).lookup("other", {**KEY, "M": 1}, h200) == new
    assert len(Store(tmp_path)) == 11
    reasons = list((tmp_path / QUARANTINE).glob(f"*{spot.name}*.reason"))
    assert len(reasons) == 1, [p.name for p in (tmp_path / QUARANTINE).iterdir()]
    store.put(make_entry(m=2, kernel="other"))  # and every put after it


def test_clearing_debris_checks_its_budget_per_folder_walked(tmp_path, make_entry):
    # a clean store's walk removes nothing: it must stop at its budget all the same
    _ten_entries(tmp_path, make_entry)
    deep = tmp_path / CURRENT / "ag_gemm"
    for i in range(5):
        (deep / f"sub{i}").mkdir()
    (deep / "sub4" / ".tmp-9-x.json").write_text("{")
    writer = Store(tmp_path, recovery_budget_s=0.0)
    writer.put(make_entry(m=11))
    assert (deep / "sub4" / ".tmp-9-x.json").exists()  # not reached in the first write
    assert not writer._recovery.cleared
    for m in range(12, 30):
        writer.put(make_entry(m=m))
    assert not (deep / "sub4" / ".tmp-9-x.json").exists() and writer._recovery.cleared


def test_recover_takes_a_budget_and_leaves_the_rest_to_the_next_write(tmp_path, make_entry):
    _ten_entries(tmp_path, make_entry)
    folder = tmp_path / CURRENT / "ag_gemm"
    for i in range(3):
        (folder / f".tmp-{i}-x.json").write_text("{")
    store = Store(tmp_path)
    report = store.recover(budget_s=0.0)
    assert report["unfinished"] and len(report["temp_files"]) < 3
    store.put(make_entry(m=11))  # a write goes on with the rest, unbounded here
    assert not list(folder.glob(".tmp-*")) and store._recovery.cleared
