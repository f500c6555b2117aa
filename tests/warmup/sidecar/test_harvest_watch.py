"""The harvest's watcher: files created or renamed into place are classified and
offered; subfolders of a flat folder are not watched; what is already there can be
offered at once."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tests.conftest import wait_for
from warmup.sidecar.harvest_watch import HarvestWatch, files_under


def json_files(path: Path) -> str | None:
    return "json" if path.suffix == ".json" else None


def test_a_file_renamed_into_place_is_offered_by_its_kind(tmp_path):
    offered: list[tuple[str, Path]] = []
    watch = HarvestWatch(json_files, lambda kind, path: offered.append((kind, path)))
    deep, flat = tmp_path / "deep", tmp_path / "flat"
    (flat / "sub").mkdir(parents=True)
    watch.start([deep], flat=[flat])
    try:
        (deep / "K").mkdir()
        (deep / "K" / "tmp.x").write_text("{}")
        os.rename(deep / "K" / "tmp.x", deep / "K" / "a.json")
        (deep / "K" / "b.bin").write_bytes(b"not one")
        (flat / "sub" / "c.json").write_text("{}")  # below a flat folder: not watched
        (flat / "d.json").write_text("{}")
        assert wait_for(lambda: ("json", flat / "d.json") in offered)
        assert wait_for(lambda: ("json", deep / "K" / "a.json") in offered)
    finally:
        watch.stop()
    assert {path for _, path in offered} == {deep / "K" / "a.json", flat / "d.json"}


def test_a_folder_not_there_is_logged_and_not_watched(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="warmup.sidecar.harvest_watch")
    watch = HarvestWatch(json_files, lambda kind, path: None)
    watch.start([], flat=[tmp_path / "missing"])
    watch.stop()
    assert "is not there; not watched" in caplog.text


def test_what_is_there_is_offered_in_order(tmp_path):
    for rel in ("b/2.json", "a/1.json", "a/0.bin", "top.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    assert [p.relative_to(tmp_path).as_posix() for p in files_under(tmp_path)] == [
        "top.json",
        "a/0.bin",
        "a/1.json",
        "b/2.json",
    ]
    offered: list[tuple[str, Path]] = []
    HarvestWatch(json_files, lambda k, p: offered.append((k, p))).offer_present(tmp_path)
    assert [p.name for _, p in offered] == ["top.json", "1.json", "2.json"]
