"""A target's verdict against one run, judged shape by shape (``bench.targets`` and
``bench.pod_targets``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """One target against one run: ``met`` is None where nothing was measured."""

    target: str
    measured: str
    met: bool | None
    misses: tuple[str, ...] = ()  # the shapes or modes that missed, named

    def cell(self) -> str:
        return "not measured" if self.met is None else "met" if self.met else "**missed**"


def shape_of(row: dict[str, Any]) -> str:
    return "x".join(map(str, row["shape"]))


def per_shape(
    target: str,
    rows: Iterable[dict[str, Any]],
    value: Callable[[dict[str, Any]], float | None],
    ok: Callable[[float], bool],
    label: Callable[[dict[str, Any]], str] = lambda r: "",
) -> Verdict:
    """A per-shape target: every measured shape must pass; shapes without the figure are
    named as not measured, and make the verdict None only if no shape has it."""
    seen, misses, lacking = [], [], []
    for row in rows:
        figure = value(row)
        if figure is None:
            lacking.append(shape_of(row))
            continue
        seen.append(f"{shape_of(row)} {figure:.3f}{label(row)}")
        if not ok(figure):
            misses.append(shape_of(row))
    measured = "; ".join(seen) if seen else "-"
    if lacking:
        measured += f" (not measured: {', '.join(lacking)})"
    met = None if not seen else not misses
    return Verdict(target, measured, met, tuple(misses))
