"""A manifest's refusal: pydantic's errors as one line per problem, cut to a number."""

import pytest
from pydantic import BaseModel, ValidationError, model_validator

from registry.core.errors import BadInput
from warmup.core.manifest_errors import MAX_ERRORS, ManifestError, at_most, describe_all
from warmup.core.manifest_shapes import ShapeSpec


def errors_of(model: type[BaseModel], data: object) -> list[dict]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return info.value.errors()


def test_the_error_names_its_source_on_every_line():
    error = ManifestError("m.yaml", ["a: bad", "b: worse"])
    assert isinstance(error, BadInput) and isinstance(error, ValueError)
    assert str(error) == "Manifest m.yaml has 2 error(s):\n  a: bad\n  b: worse"
    assert error.lines() == ["m.yaml: a: bad", "m.yaml: b: worse"]


def test_at_most_keeps_the_first_lines_and_counts_the_rest():
    few = [f"e{i}" for i in range(MAX_ERRORS)]
    assert at_most(few) == few
    many = [f"e{i}" for i in range(MAX_ERRORS + 7)]
    assert at_most(many) == [*many[:MAX_ERRORS], "... and 7 more errors"]


def test_a_union_dimension_complains_once_with_the_forms_it_takes():
    lines = describe_all(errors_of(ShapeSpec, {"M": "wide", "N": 8, "K": 8}))
    assert lines == [
        "M: must be an int, a list of ints, {pow2: [lo, hi]} or {start, stop, step} (got 'wide')"
    ]


def test_a_union_dimension_keeps_the_most_specific_complaint():
    lines = describe_all(errors_of(ShapeSpec, {"M": {"pow2": [3, 8]}, "N": 8, "K": 8}))
    assert len(lines) == 1
    assert lines[0].startswith("M: pow2 bounds [3, 8] must be powers of two")


def test_other_errors_name_their_path_and_the_value_found():
    lines = describe_all(errors_of(ShapeSpec, {"M": 8, "N": 8, "K": 8, "Q": 1}))
    assert lines == ["Q: Extra inputs are not permitted (got 1)"]
    top = describe_all(errors_of(ShapeSpec, []))
    assert top[0].startswith("(top): Input should be a valid dictionary")


class Whole(BaseModel):
    x: int = 0

    @model_validator(mode="after")
    def _refuse(self) -> "Whole":
        raise ValueError("line 3: the limit is 4")


def test_a_check_of_the_whole_is_its_own_sentence():
    assert describe_all(errors_of(Whole, {})) == ["line 3: the limit is 4"]
