"""The manifest's text read in bounded time and memory: the file, then plain data."""

import os

import pytest

from warmup.core.manifest_errors import ManifestError
from warmup.core.manifest_read import MAX_MANIFEST_BYTES, plain_data, read_bounded


def test_a_file_within_the_limit_is_read_whole(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"x" * MAX_MANIFEST_BYTES)
    assert len(read_bounded(path)) == MAX_MANIFEST_BYTES


def test_a_file_over_the_limit_is_refused_with_its_size(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"x" * (MAX_MANIFEST_BYTES + 10))
    with pytest.raises(ManifestError) as info:
        read_bounded(path)
    [line] = info.value.errors
    assert str(MAX_MANIFEST_BYTES + 10) in line and str(MAX_MANIFEST_BYTES) in line


def test_a_missing_file_or_a_fifo_is_one_error_line(tmp_path):
    with pytest.raises(ManifestError, match="cannot read"):
        read_bounded(tmp_path / "nope.yaml")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError) as info:
        read_bounded(fifo)
    assert info.value.errors == ["not a regular file (a fifo or a socket)"]
    assert info.value.source == str(fifo)


def test_plain_data_is_the_yaml_not_yet_validated():
    assert plain_data(b"\xef\xbb\xbfversion: 7\n", "m.yaml") == {"version": 7}
    assert plain_data('{"entries": []}', "m.json") == {"entries": []}


def test_a_yaml_error_names_the_source_line_and_column_with_a_caret():
    with pytest.raises(ManifestError) as info:
        plain_data("version: 1\nentries:\n  - kernel: ag_gemm: x\n", "broken.yaml")
    message = str(info.value)
    assert "broken.yaml:3:20: mapping values are not allowed" in message
    assert message.endswith("\n" + " " * (6 + 19) + "^")  # under column 20


def test_text_over_the_limit_is_refused_before_parsing():
    with pytest.raises(ManifestError) as info:
        plain_data("#" * (MAX_MANIFEST_BYTES + 1), "big.yaml")
    assert len(info.value.errors) == 1 and str(MAX_MANIFEST_BYTES) in info.value.errors[0]
