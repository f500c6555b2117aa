"""Hostile manifests: each is refused with one line per problem (CLI exit 2), in bounded
time and memory, before anything is expanded or built from it."""

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import error_line
from warmup.cli import main
from warmup.core import manifest as manifest_module
from warmup.core import plain_yaml
from warmup.core.manifest import (
    MAX_MANIFEST_BYTES,
    MAX_SHAPES,
    ManifestError,
    load_manifest,
    parse_manifest,
)
from warmup.core.manifest_shapes import Pow2, Stepped
from warmup.core.plain_yaml import MAX_DEPTH, MAX_NODES


def manifest(*entries: dict) -> str:
    return json.dumps({"version": 1, "entries": list(entries)})


def entry(*shapes: dict, world_size: int = 1) -> dict:
    return {"kernel": "matmul", "dtype": "bf16", "world_size": world_size, "shapes": list(shapes)}


def refusal(text: str | bytes) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, source="m.yaml")
    return info.value.errors


class Materialised(Exception):
    pass


def test_a_billion_value_range_is_counted_not_listed(monkeypatch):
    def refuse(self):
        raise Materialised(self)

    monkeypatch.setattr(Stepped, "values", refuse)
    monkeypatch.setattr(Pow2, "values", refuse)
    line = {"M": {"start": 1, "stop": 1_000_000_001}, "N": {"pow2": [1, 1024]}, "K": 1}
    [error] = refusal(manifest(entry(line)))
    assert error.startswith("entries.0.shapes.0: ")
    assert f"{1_000_000_000 * 11} shapes" in error and f"the limit is {MAX_SHAPES}" in error


def test_the_shape_limit_is_for_the_whole_manifest_and_names_the_line_that_passes_it():
    half = {"M": list(range(1, 2049)), "N": 8, "K": 8}  # 2048 shapes, within any entry limit
    exactly = manifest(entry(half), entry(half, world_size=2))
    assert sum(parse_manifest(exactly).shape_count(w) for w in (1, 2)) == MAX_SHAPES
    [error] = refusal(manifest(entry(half), entry({"M": 1, "N": 1, "K": 1}, half)))
    assert error.startswith("entries.1.shapes.1: ")
    assert f"{2 * 2048 + 1} shapes" in error and f"the limit is {MAX_SHAPES}" in error


def test_a_thousand_entries_share_one_limit():
    lines = [{"M": [1, 2, 4, 8], "N": [16, 32], "K": 64}] * 1000  # 8 shapes each
    [error] = refusal(manifest(*(entry(line) for line in lines)))
    assert error.startswith("entries.512.shapes.0: ") and "8000 shapes" in error


def test_expand_still_drops_duplicates_that_the_count_includes():
    text = manifest(entry({"M": [8, 8, 16], "N": 8, "K": 8}, {"M": 8, "N": 8, "K": 8}))
    assert parse_manifest(text).entries[0].expand() == [
        {"M": 8, "N": 8, "K": 8},
        {"M": 16, "N": 8, "K": 8},
    ]


@pytest.mark.parametrize(
    "dim,expected",
    [
        (2**31, "M=2147483648 must be <= 2147483647"),
        ([64, 2**31], "M=2147483648 must be <= 2147483647"),
        ([64, 0], "M=0 must be >= 1"),
        ({"start": 1, "stop": 2**31 + 1}, "must be <= 2147483647"),
        ({"pow2": [1, 2**31]}, "pow2 bounds [1, 2147483648]"),
        (list(range(1, MAX_SHAPES + 2)), f"4097 values; a list holds at most {MAX_SHAPES}"),
    ],
)
def test_dimensions_are_positive_int32(dim, expected):
    errors = refusal(manifest(entry({"M": dim, "N": 8, "K": 8})))
    assert any(e.startswith("entries.0.shapes.0.M: ") and expected in e for e in errors), errors


BILLION_LAUGHS = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


@pytest.mark.parametrize(
    "text,line",
    [
        (BILLION_LAUGHS, 1),
        (
            "version: 1\nentries:\n  - kernel: matmul\n    dtype: bf16\n    world_size: 1\n"
            "    shapes: [&one {M: 8, N: 8, K: 8}, *one]\n",
            6,
        ),
        ("version: 1\nentries: *nothing\n", 2),
    ],
)
def test_yaml_anchors_and_aliases_are_refused_before_building_anything(text, line):
    assert refusal(text) == [f"YAML aliases and anchors are not allowed: line {line}"]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_refused_at_the_depth_limit(depth):
    errors = refusal("[" * depth + "]" * depth)
    assert errors == [f"nesting deeper than {MAX_DEPTH} levels: line 1"]


def library_limit(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A YAML parser that refuses past ``limit`` brackets before it yields an event, as
    libyaml does at 1,000 deep, in its own words; else at the end, for another reason."""

    def parse(text, Loader):
        index = len(text)
        if text.count("[") + text.count("{") > limit:
            index = [i for i, c in enumerate(text) if c in "[{"][limit]
        problem = "too deep for me" if index < len(text) else "something else"
        mark = yaml.Mark("<unicode string>", index, 0, index, text, index)
        raise yaml.parser.ParserError(None, None, problem, mark)

    monkeypatch.setattr(plain_yaml.yaml, "parse", parse)


@pytest.mark.parametrize("limit", [MAX_DEPTH, 64, 1000])
def test_deep_nesting_is_ours_whatever_limit_the_yaml_library_has(limit, monkeypatch):
    library_limit(limit, monkeypatch)
    depth = max(limit, MAX_DEPTH) + 1
    assert refusal("\n" + "[" * depth + "]" * depth) == [
        f"nesting deeper than {MAX_DEPTH} levels: line 2"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "'" + "[" * 40 + "' : [1, 2",  # brackets in a quoted scalar
        '"' + "{" * 40 + '" : [1, 2',
        "# " + "[" * 40 + "\nx: [1, 2",  # in a comment
    ],
)
def test_brackets_in_quotes_and_comments_are_not_nesting(text, monkeypatch):
    library_limit(100, monkeypatch)
    [error] = refusal(text)
    assert "nesting" not in error and "something else" in error


def test_the_pure_python_parser_is_held_to_the_depth_limit_too(monkeypatch):
    monkeypatch.setattr(plain_yaml, "_BaseLoader", yaml.SafeLoader)
    depth = 5000
    assert refusal("[" * depth + "]" * depth) == [f"nesting deeper than {MAX_DEPTH} levels: line 1"]


def test_nesting_at_the_limit_reaches_validation():
    depth = MAX_DEPTH
    errors = refusal("[" * depth + "]" * depth)
    assert errors[0].startswith("(top): Input should be a valid dictionary")


def test_too_many_yaml_nodes_are_refused_before_validation():
    text = manifest(entry({"M": 8, "N": 8, "K": 8}))[:-1] + ', "x": [' + "1," * MAX_NODES + "1]}"
    [error] = refusal(text)
    assert error.startswith(f"more than {MAX_NODES} YAML nodes")


def test_duplicate_keys_name_the_key_and_both_lines():
    text = (
        "version: 1\nentries:\n  - kernel: matmul\n    dtype: bf16\n    dtype: fp16\n"
        "    world_size: 1\n    shapes:\n      - {M: 8, N: 8,\n         M: 16, K: 8}\n"
    )
    assert refusal(text) == [
        "duplicate key 'dtype' at lines 4 and 5",
        "duplicate key 'M' at lines 8 and 9",
    ]


def test_a_duplicate_json_key_is_refused_too():
    text = '{"version": 1, "version": 1, "entries": []}'
    assert refusal(text)[0] == "duplicate key 'version' at line 1, columns 2 and 16"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("version: !!python/object:os.system x\n", "line 1: YAML tag !!python/object:os.system"),
        ("version: 1\nentries:\n  - <<: {dtype: bf16}\n", "line 3: YAML tag !!merge is not"),
        ("version: !!set {a, b}\n", "line 1: YAML tag !!set is not allowed"),
        ("? [a, b]\n: 1\n", "a list or mapping as a mapping key: line 1"),
    ],
)
def test_only_plain_yaml_types_are_built(text, expected):
    [error] = refusal(text)
    assert error.startswith(expected), error


@pytest.mark.parametrize(
    "scalar,expected",
    [
        ("1" * 5000, "line 6: an integer of 5000 characters"),
        ("!!int eight", "line 6: !!int 'eight' is refused: ValueError"),
        ("!!bool maybe", "line 6: !!bool 'maybe' is refused: KeyError"),
        ("!!timestamp soon", "line 6: !!timestamp 'soon' is refused: AttributeError"),
    ],
)
def test_scalars_their_type_refuses_are_one_line_with_their_line(scalar, expected):
    text = (
        "version: 1\nentries:\n  - kernel: matmul\n    dtype: bf16\n    world_size: 1\n"
        f"    shapes: [{{M: {scalar}, N: 8, K: 8}}]\n"
    )
    [error] = refusal(text)
    assert error.startswith(expected) and len(error) < 200, error


def test_a_huge_value_is_shortened_in_its_error_line():
    kernel = "x" * 500_000
    errors = refusal(manifest({**entry({"M": 8, "N": 8, "K": 8}), "kernel": kernel}))
    assert errors[0].startswith("entries.0: kernel 'xxx")
    assert max(len(e) for e in errors) < 300, [len(e) for e in errors]


def test_a_flood_of_errors_is_cut_to_a_readable_number():
    bad = [{"M": 8, "N": 8, "K": 8, "Q": i} for i in range(1000)]
    errors = refusal(manifest(entry(*bad)))
    assert len(errors) == manifest_module.MAX_ERRORS + 1
    assert errors[-1] == f"... and {1000 - manifest_module.MAX_ERRORS} more errors"


GOOD = manifest(entry({"M": 8, "N": 8, "K": 8}))


@pytest.mark.parametrize(
    "data,expected",
    [
        (GOOD.encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
        (GOOD.encode("utf-16-be"), "not UTF-8 text (byte 0x00 at offset 0)"),
        (GOOD.encode() + b"\n# caf\xe9\n", f"not UTF-8 text (byte 0xe9 at offset {len(GOOD) + 6})"),
    ],
)
def test_only_utf8_text_is_read(isolated, capsys, data, expected):
    path = isolated / "m.yaml"
    path.write_bytes(data)
    assert main(["validate", str(path)]) == 2
    assert error_line(capsys.readouterr().err) == f"triton-warmup: error: {path}: {expected}"


def test_a_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "m.json"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_manifest(path).entries[0].kernel == "matmul"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("version: 1\nentries: [{kernel: matmul, M: " + "1" * 5000 + "}]\n", "an integer of"),
        ("[" * 1000 + "]" * 1000, "nesting deeper than"),
        ("a: &x 1\nb: *x\n", "aliases and anchors"),
        ("version: 1\nversion: 1\n", "duplicate key 'version'"),
        ("version: 1\x01\n", "control characters are not allowed (#x0001 at character"),
    ],
)
def test_the_cli_prints_one_line_and_exits_2(isolated, capsys, text, expected):
    path = isolated / "m.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    assert expected in error_line(capsys.readouterr().err)


def test_a_file_over_the_size_limit_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "\n" + "#" * MAX_MANIFEST_BYTES + "\n")  # valid YAML, but too big
    size = path.stat().st_size
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert info.value.errors == [f"{size} bytes; a manifest is at most {MAX_MANIFEST_BYTES}"]


def test_an_endless_file_is_refused_after_the_limit():
    with pytest.raises(ManifestError) as info:
        load_manifest(Path("/dev/zero"))
    assert info.value.errors == [
        f"more than {MAX_MANIFEST_BYTES} bytes; a manifest is at most {MAX_MANIFEST_BYTES}"
    ]


def test_text_over_the_size_limit_is_refused_by_parse_manifest_too():
    errors = refusal(GOOD + " " * MAX_MANIFEST_BYTES)
    assert errors == [  # characters: at least as many bytes
        f"more than {MAX_MANIFEST_BYTES} bytes; a manifest is at most {MAX_MANIFEST_BYTES}"
    ]


def test_a_second_yaml_document_is_refused():
    assert refusal(GOOD + "\n---\n" + GOOD) == ["more than one YAML document: line 2"]


def test_a_large_manifest_within_every_limit_is_read():
    entries = [
        entry({"M": {"start": 1, "stop": 2}, "N": {"pow2": [8, 8]}, "K": [i]})
        for i in range(1, MAX_SHAPES + 1)
    ]
    text = manifest(*entries)
    parsed = parse_manifest(text.encode())
    assert parsed.shape_count(1) == MAX_SHAPES


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "manifest.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError) as info:  # once: blocked in open() forever
        load_manifest(fifo)
    assert info.value.errors == ["not a regular file (a fifo or a socket)"]


def test_an_empty_range_is_an_error_not_a_line_of_no_shapes():
    with pytest.raises(ManifestError) as info:  # once: the line silently warmed nothing
        parse_manifest(manifest(entry({"M": {"start": 5, "stop": 3}, "N": 8, "K": 8})))
    assert "no value" in info.value.errors[0]
