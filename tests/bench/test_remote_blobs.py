"""The remote-blobs bench's builder and verdicts, at a small size (no redis, no child)."""

from bench import remote_blobs as b
from registry.caches import inductor_cache


def _row(**given):
    row = {"case": "fetch", "code": "this", "expected": True, "ok": True, "s": 1.0,
           "deadline_s": 7.25, "peak_mib": 16.0, "errors": 0, "why": ""}  # fmt: skip
    return {**row, **given}


def test_the_volume_holds_one_blob_of_the_size_asked(tmp_path):
    root = b.volume(tmp_path / "data", 3 * b.MIB + 5)
    sizes = sorted(p.stat().st_size for p in (root / "blobs").rglob("*") if p.is_file())
    assert sizes == [len(b"a small file"), 3 * b.MIB + 5]
    big = next(p for p in (root / "blobs").rglob("*") if p.stat().st_size > b.MIB)
    assert inductor_cache.file_sha(big) == big.name
    assert not (tmp_path / "data" / "cache").exists()


def test_a_move_meets_the_target_within_its_memory_and_deadline():
    assert b.met(_row())
    assert not b.met(_row(peak_mib=b.TARGET_MIB + 1))  # the blob in memory
    assert not b.met(_row(s=7.25 + b.SLACK_S + 0.1))  # past its deadline
    assert not b.met(_row(ok=False))  # a busy server not waited for


def test_a_slow_server_meets_the_target_only_when_cut_at_its_deadline():
    assert b.met(_row(expected=False, ok=False, s=7.3))
    assert not b.met(_row(expected=False, ok=False, s=1.02))  # cut at the first second
    assert not b.met(_row(expected=False, ok=True, s=7.0))
