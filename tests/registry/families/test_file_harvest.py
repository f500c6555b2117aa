"""The reads a family's one-by-one harvest checks with: bounded, at a folder opened
without following links; and the values it returns."""

from __future__ import annotations

import pytest

from registry.core import atomic
from registry.families import file_harvest as fh
from registry.families.base import Family
from tests.registry.families.conftest import make_scope


def test_a_file_is_read_at_its_folder_within_its_limit(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"12345")
    with fh.opened(tmp_path) as at:
        assert fh.read_at(at, "f.bin", 5) == b"12345"
        with pytest.raises(fh.Refused, match="the limit left is 4"):
            fh.read_at(at, "f.bin", 4)
        with pytest.raises(fh.Refused, match=r"gone\.bin: No such file"):
            fh.read_at(at, "gone.bin", 5)


def test_a_link_is_never_read_through(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f.bin").write_bytes(b"secret")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with (
        pytest.raises(fh.Refused, match="its folder is a link or gone"),
        fh.opened(tmp_path / "link"),
    ):
        pass
    (tmp_path / "real" / "l.bin").symlink_to(tmp_path / "real" / "f.bin")
    with fh.opened(tmp_path / "real") as at, pytest.raises(fh.Refused, match="symbolic links"):
        fh.read_at(at, "l.bin", 100)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (".hidden", True),
        ("tmp.x.so", True),
        (f"{atomic.TEMP_PREFIX}abc", True),
        ("a.so.tmp", True),
        ("a.lock", True),
        ("a.so", False),
        ("__grp__k.json", False),
    ],
)
def test_a_writers_temporary_file_is_known_by_its_name(name, expected):
    assert fh.temporary(name) is expected


def test_values():
    def send(remote, upload):
        return True

    assert fh.Upload("k", "n", b"d", send) == fh.Upload("k", "n", b"d", lambda r, u: False)
    assert fh.Harvested("harvested", 3).uploads == ()
    assert fh.FileLimits().max_file_bytes == 64 * 2**20


def test_a_family_takes_no_file_by_default(tmp_path):
    scope = make_scope(tmp_path)
    family = Family()
    assert family.file_folders(scope) == [] and dict(family.file_kinds) == {}
    assert family.file_kind(scope, tmp_path / "any") is None
    with pytest.raises(fh.Refused, match="harvests no kernel file"):
        family.harvest_file(scope, "kernel", tmp_path / "any", fh.FileLimits())
