"""The hostile-inputs bench's builders and verdicts, at small sizes (no child process)."""

import gzip
import json
import math
import tarfile

from bench import hostile_inputs as h
from registry.bundles import bundle
from registry.core import atomic
from tests.registry._bundles import UNSIGNED_OK
from warmup.compiled import learned


def _ok(peak_kib=1024, **outcome):
    return {"idle_kib": 0, "peak_kib": peak_kib, "seconds": 0.1, "wchar": 0, "warnings": [],
            "outcome": outcome}  # fmt: skip


def test_a_learned_file_is_exactly_its_size_within_the_value_limit_and_its_dims_last(tmp_path):
    path = tmp_path / "learned-0-1.json"
    h.learned_file(path, {"batch": 3, "seq": 5}, 8192, junk=100)
    data = path.read_bytes()
    assert len(data) == 8192 and atomic.json_values(data) <= learned.MAX_FILE_VALUES
    dims = json.loads(data)["models"][h.MODEL]
    assert len(dims) == 101 and dims[-1] == {"batch": 3, "seq": 5}


def test_each_learned_file_offers_a_dims_of_its_own_none_declared(tmp_path):
    offered = h.learned_folder(tmp_path / "m", 5, 4096, junk=10)
    assert len({json.dumps(d, sort_keys=True) for d in offered.values()}) == 5
    assert {"batch": 2, "seq": 8} not in h.allowed_dims()
    assert len(h.allowed_dims()) == 16 * 8 - 2


def test_the_import_folder_holds_each_hostile_file(tmp_path):
    made = h.autotune_folder(
        tmp_path / "src", tmp_path / "out", sparse_bytes=2**20, configs=10, depth=10
    )
    assert made["sparse"].stat().st_size == 2**20 and made["sparse"].stat().st_blocks == 0
    assert len(json.loads(made["many"].read_bytes())["configs_timings"]) == 10
    assert made["deep"].read_bytes() == b"[" * 10 + b"]" * 10
    assert made["link"].is_symlink() and made["folder_link"].is_symlink()
    assert not str(made["link"].resolve()).startswith(str(tmp_path / "src"))


def test_the_hostile_bundle_carries_one_blob_its_index_names_under_every_path(tmp_path):
    out = tmp_path / "b.tgz"
    declared = h.one_blob_many_paths(out, copies=5, size=3000)
    with gzip.open(out) as f, tarfile.open(fileobj=f) as tar:
        names = tar.getnames()
        index = json.load(tar.extractfile(names[2]))
        index_bytes = tar.getmember(names[2]).size
    assert names[0] == bundle.MANIFEST and names[1].startswith("inductor/blobs/")
    assert len(index["files"]) == 5 and {sha for sha, _ in index["files"].values()} == {
        names[1].rsplit("/", 1)[1]
    }
    assert declared == 3000 + index_bytes
    assert (
        len(bundle.verify(out, trust=UNSIGNED_OK).parts["inductor"].indexes) == 1
    )  # well formed: only its size is hostile


def test_verdicts_need_the_memory_and_the_outcome():
    assert h.verdict_oversized_index(_ok(fetched=False, files_written=0) | {"warnings": [
        "x skipped: 5 bytes; limit 4"]})  # fmt: skip
    assert not h.verdict_oversized_index(_ok(peak_kib=65 * 1024 + 1, fetched=False,
                                             files_written=0))  # fmt: skip
    assert not h.verdict_bundle(_ok(installed=True, bytes_left_in_targets=0), declared=10)
    assert h.verdict_bundle(_ok(installed=False, bytes_left_in_targets=0), declared=10)
    assert not h.verdict_bundle(_ok(installed=False, bytes_left_in_targets=1), declared=10)
    crashed = {"crashed": "exit 1"}
    assert math.isnan(h.peak_mib(crashed)) and not h.within_memory(crashed)


def test_a_deadline_verdict_allows_half_a_second_and_needs_a_failure():
    late = _ok(result=None) | {"seconds": 1.51}
    on_time = _ok(result=None) | {"seconds": 1.49}
    assert h.verdict_deadline(on_time, 1.0, lambda r: r is None)
    assert not h.verdict_deadline(late, 1.0, lambda r: r is None)
    assert not h.verdict_deadline(on_time, 1.0, lambda r: r == [])


def test_a_growing_file_may_be_skipped_or_stored_at_the_size_stored():
    base = {"sizes_not_their_blobs": [], "others_missing": []}
    assert h.verdict_growing(_ok(**base, grower_in_index=None, grower_blob_bytes=None))
    assert h.verdict_growing(_ok(**base, grower_in_index=1010, grower_blob_bytes=1010))
    assert not h.verdict_growing(_ok(**base, grower_in_index=10, grower_blob_bytes=1010))
