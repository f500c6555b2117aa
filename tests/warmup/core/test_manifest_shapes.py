"""The shapes a manifest declares: dimensions counted before they are listed, bounds."""

import pytest
from pydantic import ValidationError

from warmup.core import manifest_shapes as shapes
from warmup.core.manifest_shapes import MAX_DIM, MAX_SHAPES, Pow2, ShapeSpec, Stepped, TensorSpec


@pytest.mark.parametrize(
    ("dim", "values"),
    [
        (7, [7]),
        ([3, 1, 3], [3, 1, 3]),  # as written: duplicates are the manifest's to count
        (Pow2(pow2=(2, 16)), [2, 4, 8, 16]),
        (Stepped(start=1024, stop=4097, step=1024), [1024, 2048, 3072, 4096]),
        (Stepped(start=5, stop=6), [5]),
    ],
)
def test_each_kind_of_dimension_counts_what_it_lists(dim, values):
    assert shapes.dim_values(dim) == values and shapes.dim_count(dim) == len(values)


def test_a_huge_range_is_counted_without_being_listed(monkeypatch):
    def refuse(self):
        raise AssertionError("listed")

    monkeypatch.setattr(Stepped, "values", refuse)
    monkeypatch.setattr(Pow2, "values", refuse)
    assert shapes.dim_count(Stepped(start=1, stop=MAX_DIM + 1)) == MAX_DIM
    assert ShapeSpec(M=Pow2(pow2=(1, 2**30)), N=[1, 2], K=Stepped(start=1, stop=4)).count() == 186


def test_a_shape_line_stands_for_every_combination_m_slowest():
    line = ShapeSpec(M=[1, 2], N=Pow2(pow2=(4, 8)), K=3)
    assert line.expand() == [
        {"M": 1, "N": 4, "K": 3},
        {"M": 1, "N": 8, "K": 3},
        {"M": 2, "N": 4, "K": 3},
        {"M": 2, "N": 8, "K": 3},
    ]


@pytest.mark.parametrize(
    ("dim", "message"),
    [
        (0, "N=0 must be >= 1"),
        (MAX_DIM + 1, f"N={MAX_DIM + 1} must be <= {MAX_DIM}"),
        ([4, -1], "N=-1 must be >= 1"),
        ([1] * (MAX_SHAPES + 1), f"{MAX_SHAPES + 1} values; a list holds at most {MAX_SHAPES}"),
    ],
)
def test_a_dimension_out_of_bounds_is_named_with_its_limit(dim, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        shapes.check_dim("N", dim)
    assert shapes.check_dim("N", 4) == 4


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Pow2(pow2=(3, 8)), "pow2 bounds [3, 8] must be powers of two"),
        (lambda: Pow2(pow2=(8, 4)), "pow2 bounds [8, 4] must be powers of two"),
        (lambda: Stepped(start=4, stop=4), "range start 4, stop 4: no value"),
        (lambda: Stepped(start=1, stop=MAX_DIM + 2), f"values must be <= {MAX_DIM}"),
        (lambda: TensorSpec(shape=[0], dtype="fp32"), f"size 0 must be in [1, {MAX_DIM}]"),
    ],
)
def test_bad_bounds_are_refused_by_the_model_itself(make, message):
    with pytest.raises(ValidationError) as info:
        make()
    assert message in str(info.value)


def test_an_input_tensor_sizes_its_named_dims():
    spec = TensorSpec(shape=["batch", "seq", 2048], dtype="int64", high=32000)
    assert spec.dim_names() == {"batch", "seq"}
    assert spec.sized({"batch": 4, "seq": 128}) == [4, 128, 2048]
