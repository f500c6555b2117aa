"""A model's package folder: the package and what it is, or why there is none; an
unfinished or unreadable folder reads as nothing."""

from __future__ import annotations

from warmup.compiled import package_files
from warmup.compiled.package_files import (
    FAILED,
    INFO,
    PACKAGE,
    PackageFailed,
    PackageInfo,
    write_failed,
    write_info,
)

INFO_ = PackageInfo(
    name="mlp", key_digest="k" * 32, torch="2.13.0", triton="3.9.0", device="cpu",
    ranges={"batch": (1, 4)}, constants=["up.weight"],
)  # fmt: skip


def test_a_package_reads_back_once_its_info_is_written(tmp_path):
    (tmp_path / PACKAGE).write_bytes(b"PK")
    assert package_files.read(tmp_path) is None  # unfinished: no info yet
    write_info(tmp_path, INFO_)
    found = package_files.read(tmp_path)
    assert isinstance(found, PackageInfo) and found.ranges == {"batch": (1, 4)}
    assert found.made > 0


def test_a_failure_replaces_a_package_and_a_package_replaces_a_failure(tmp_path):
    (tmp_path / PACKAGE).write_bytes(b"PK")
    write_info(tmp_path, INFO_)
    failed = PackageFailed(name="mlp", key_digest="k" * 32, torch="2.13.0", stage="export",
                           reason="a dim is specialised")  # fmt: skip
    write_failed(tmp_path, failed)
    assert not (tmp_path / PACKAGE).exists() and not (tmp_path / INFO).exists()
    found = package_files.read(tmp_path)
    assert isinstance(found, PackageFailed) and found.stage == "export"
    (tmp_path / PACKAGE).write_bytes(b"PK")
    write_info(tmp_path, INFO_)
    assert not (tmp_path / FAILED).exists()
    assert isinstance(package_files.read(tmp_path), PackageInfo)


def test_an_unreadable_record_is_nothing(tmp_path):
    (tmp_path / PACKAGE).write_bytes(b"PK")
    (tmp_path / INFO).write_text("{not json")
    assert package_files.read(tmp_path) is None
    assert package_files.read(tmp_path / "missing") is None
