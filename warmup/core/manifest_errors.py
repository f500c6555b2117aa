"""A manifest's refusal: :class:`ManifestError`, one line per problem.

pydantic's errors become the lines a person reads: each names its field path and the
value found, a union dimension's complaints (one per member tried) become one line, and
at most :data:`MAX_ERRORS` lines are listed, then how many more.
"""

from __future__ import annotations

from typing import Any

from registry.core.errors import BadInput
from warmup.core.manifest_shapes import Pow2, Stepped
from warmup.core.plain_yaml import clip, short

MAX_ERRORS = 50  # error lines listed; the rest are counted
_UNION_MEMBERS = {"int", "list[int]", Pow2.__name__, Stepped.__name__}  # as pydantic names them
_DIM_HELP = "must be an int, a list of ints, {pow2: [lo, hi]} or {start, stop, step}"


class ManifestError(BadInput, ValueError):
    """The manifest is unusable; ``errors`` holds one line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"Manifest {source} has {len(errors)} error(s):\n  " + "\n  ".join(errors))
        self.source, self.errors = source, errors

    def lines(self) -> list[str]:
        """One line per problem, each naming the manifest (a YAML error keeps its caret)."""
        return [f"{self.source}: {error}" for error in self.errors]


def at_most(errors: list[str]) -> list[str]:
    """The first :data:`MAX_ERRORS` lines, then how many more."""
    if len(errors) <= MAX_ERRORS:
        return errors
    return [*errors[:MAX_ERRORS], f"... and {len(errors) - MAX_ERRORS} more errors"]


def describe_all(errors: list[Any]) -> list[str]:
    """One line per problem of pydantic's ``errors()``: a union dimension's per-member
    complaints become one."""
    lines: list[str] = []
    dims: dict[str, tuple[str, Any]] = {}
    for error in errors:
        loc = [clip(str(p), 60) for p in error["loc"]]
        member = next((p for p in loc if _is_member(p)), None)
        message = str(error["msg"]).removeprefix("Value error, ")
        if member is None:
            whole = not loc and error["type"] == "value_error"  # the shape limit: names its line
            got = f" (got {short(error.get('input'))})"
            lines.append(message if whole else f"{'.'.join(loc) or '(top)'}: {message}{got}")
            continue
        path = ".".join(loc[: loc.index(member)])
        custom = error["type"] == "value_error"  # our own check: the most specific
        if path not in dims or custom:
            dims[path] = (message if custom else _DIM_HELP, error.get("input"))
    for path, (message, value) in dims.items():
        lines.append(f"{path}: {message} (got {short(value)})")
    return lines


def _is_member(part: str) -> bool:
    # pydantic names the union member it tried: "int", "Pow2", "function-after[..., Pow2]"
    return part in _UNION_MEMBERS or part.startswith("function-")
