"""Learned shapes: a call's dims read from its inputs, recorded once by the serving
process, merged into the volume by the harvest, nothing untrusted kept."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest
import torch

from tests.conftest import write_manifest
from tests.warmup.compiled.models import manifest as models_manifest
from warmup.compiled import learned
from warmup.core.manifest import load_manifest


@pytest.fixture
def manifest(tmp_path):
    text = models_manifest(("mlp", "mlp", "{batch: [2, 16], seq: [8]}"))
    return load_manifest(write_manifest(tmp_path / "m.yaml", text))


def inputs(batch, seq):
    return torch.zeros(batch, seq, 32), torch.zeros(batch, dtype=torch.int64)


def test_a_calls_dims_are_read_from_its_inputs_as_the_manifest_names_them(manifest):
    entry = manifest.model("mlp")
    assert learned.call_dims(entry, inputs(3, 5)) == {"batch": 3, "seq": 5}
    x, _ = inputs(3, 5)
    assert learned.call_dims(entry, (x, torch.zeros(4, dtype=torch.int64))) is None  # 3 != 4
    assert learned.call_dims(entry, (torch.zeros(3, 5, 16), x)) is None  # 16 is not 32
    assert learned.call_dims(entry, (x,)) is None
    assert learned.call_dims(entry, ("text", 1)) is None


def test_the_recorder_keeps_new_dims_once_and_bounded(tmp_path, manifest, monkeypatch):
    entry = manifest.model("mlp")
    recorder = learned.Recorder(tmp_path / "metrics", rank=0)
    assert not recorder.add(entry, {"batch": 2, "seq": 8})  # declared
    assert recorder.add(entry, {"batch": 3, "seq": 8})
    assert not recorder.add(entry, {"batch": 3, "seq": 8})  # known
    assert json.loads(recorder.path.read_text()) == {"models": {"mlp": [{"batch": 3, "seq": 8}]}}
    monkeypatch.setattr(learned, "MAX_LEARNED", 2)
    assert recorder.add(entry, {"batch": 5, "seq": 8})
    assert not recorder.add(entry, {"batch": 6, "seq": 8})


def test_the_harvest_merges_what_servers_learned_into_the_volume(tmp_path, manifest):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    folder.mkdir()
    (folder / "learned-0-1.json").write_text(
        json.dumps({"models": {"mlp": [{"batch": 3, "seq": 8}, {"batch": 2, "seq": 8}]}})
    )
    (folder / "learned-1-2.json").write_text(
        json.dumps({"models": {"mlp": [{"batch": 3, "seq": 8}, {"batch": 7, "seq": 8}]}})
    )
    assert learned.merge(folder, root, manifest) == 2  # 2x8 is declared, 3x8 seen twice
    entry = manifest.model("mlp")
    assert learned.learned_dims(root, entry) == [{"batch": 3, "seq": 8}, {"batch": 7, "seq": 8}]
    assert learned.merge(folder, root, manifest) == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"batch": 3},  # a dim missing
        {"batch": 3, "seq": 8, "heads": 2},  # a dim the model lacks
        {"batch": 0, "seq": 8},
        {"batch": True, "seq": 8},
        {"batch": "3", "seq": 8},
        {"batch": 2**40, "seq": 8},
        {"batch": 17, "seq": 8},  # past the largest declared batch
        {"batch": 3, "seq": 9},
        [3, 8],
    ],
)
def test_dims_that_do_not_fit_the_model_are_never_kept(tmp_path, manifest, bad):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    folder.mkdir()
    (folder / "learned-0-1.json").write_text(json.dumps({"models": {"mlp": [bad]}}))
    assert learned.merge(folder, root, manifest) == 0
    root.mkdir()
    (root / "mlp.json").write_text(json.dumps({"dims": [bad, {"batch": 9, "seq": 8}]}))
    assert learned.learned_dims(root, manifest.model("mlp")) == [{"batch": 9, "seq": 8}]


def test_recording_a_call_never_fails_the_request(tmp_path, manifest):
    recorder = learned.Recorder(tmp_path / "metrics", rank=0)

    class Unsized:
        shape = object()  # len() raises

    recorder.record(manifest.model("mlp"), (Unsized(), Unsized()))
    recorder.record(manifest.model("mlp"), inputs(3, 8))
    assert recorder.models == {"mlp": [{"batch": 3, "seq": 8}]}


def test_an_unreadable_file_is_skipped(tmp_path, manifest):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    folder.mkdir()
    root.mkdir()
    (folder / "learned-0-1.json").write_text("{not json")
    (root / "mlp.json").write_bytes(b"\x00" * 10)
    assert learned.merge(folder, root, manifest) == 0
    assert learned.learned_dims(root, manifest.model("mlp")) == []


def _learned_file(folder, name, dims, **extra):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps({"models": {"mlp": dims, **extra}}))


def test_a_merge_reads_at_most_the_newest_files(tmp_path, manifest, monkeypatch):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    for i, batch in enumerate((3, 4, 5, 6)):
        _learned_file(folder, f"learned-0-{i}.json", [{"batch": batch, "seq": 8}])
        os.utime(folder / f"learned-0-{i}.json", (1000 + i, 1000 + i))
    monkeypatch.setattr(learned, "MAX_FILES", 2)
    assert learned.merge(folder, root, manifest) == 2
    assert learned.learned_dims(root, manifest.model("mlp")) == [
        {"batch": 5, "seq": 8},
        {"batch": 6, "seq": 8},
    ]


def test_a_file_of_too_many_values_is_skipped_unparsed_and_the_others_merge(
    tmp_path, manifest, caplog
):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    junk = [{"batch": 3, "seq": 8}] + [[0]] * learned.MAX_FILE_VALUES  # small, but many
    _learned_file(folder, "learned-0-1.json", junk)
    _learned_file(folder, "learned-0-2.json", [{"batch": 4, "seq": 8}])
    assert learned.merge(folder, root, manifest) == 1
    assert learned.learned_dims(root, manifest.model("mlp")) == [{"batch": 4, "seq": 8}]
    assert f"limit {learned.MAX_FILE_VALUES}" in caplog.text


def test_a_merge_keeps_its_memory_small_whatever_the_files_hold(tmp_path, manifest):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    many = [{"batch": 3, "seq": 8}] * (learned.MAX_FILE_VALUES // 20)  # under the bounds
    for i in range(30):
        other = {f"model{j}": many for j in range(2)}  # models the manifest lacks
        _learned_file(folder, f"learned-0-{i}.json", many, **other)
    tracemalloc.start()
    try:
        new = learned.merge(folder, root, manifest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert new == 1 and peak < 16 * 2**20  # what it kept: one dims, not 30 files' lists


def test_a_merge_reads_a_bounded_total(tmp_path, manifest, monkeypatch):
    folder, root = tmp_path / "metrics", tmp_path / "learned"
    for i, batch in enumerate((3, 4, 5)):
        _learned_file(folder, f"learned-0-{i}.json", [{"batch": batch, "seq": 8}])
    size = (folder / "learned-0-0.json").stat().st_size
    monkeypatch.setattr(learned, "MAX_READ_BYTES", 2 * size)
    assert learned.merge(folder, root, manifest) == 2
