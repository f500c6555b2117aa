"""A predicted hit or miss for one cache family, and the factor that makes a miss.

Each family compares what it holds with this host in its own terms and hands
:func:`predict` one dict of differences per thing it holds (a tuned entry, a compiled
kernel, an autotune result, a model's index): ``{factor: (this host's, stored)}``, empty
for a thing this host would use. :func:`predict` counts them and names the factor that
keeps the most things from being used, so one line says what to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["hit", "partial", "miss", "empty"]
OUTCOMES: tuple[Outcome, ...] = ("hit", "partial", "miss", "empty")
Differences = Mapping[str, tuple[object, object]]

# The factors in the order a person fixes them: the first one that differs is the one
# named, since later ones are often consequences of it (a new Triton, a new ptxas).
FACTORS = (
    "torch",
    "Triton version",
    "Triton build",
    "GPU model",
    "compute capability",
    "CUDA",
    "driver",
    "ptxas",
    "env",
    "path",
    "kernel source",
    "model code or shapes",
)


@dataclass(frozen=True)
class Prediction:
    """One family's prediction: ``usable`` of the ``held`` things this host would hit."""

    family: str
    outcome: Outcome
    held: int
    usable: int
    factor: str = ""  # what keeps the others from hitting: "compute capability"
    mine: str = ""  # this host's value of it
    stored: str = ""  # the stored things' value
    missing: int = 0  # things declared here and held nowhere (a model with no artifacts)
    note: str = ""

    def line(self) -> str:
        """One line a person can act on."""
        head = f"{self.family}: {self.outcome.upper()}"
        if self.outcome == "empty":
            return f"{head}: nothing stored{_note(self.note)}"
        counts = f"{self.usable} of {self.held} stored usable"
        if self.missing:
            counts = f"{counts}, " if self.held else ""
            counts += f"{self.missing} declared and not stored (compiled at warmup)"
        if not self.factor:
            return f"{head}: {counts}{_note(self.note)}"
        stored, mine = self.stored or "unset", self.mine or "unset"
        why = f"{self.factor} differs: stored {stored}, this host {mine}"
        return f"{head}: {counts}; {why}{_note(self.note)}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}


def _note(note: str) -> str:
    return f" ({note})" if note else ""


def predict(
    family: str, held: Iterable[Differences], *, missing: int = 0, note: str = ""
) -> Prediction:
    """Count the things ``held`` (one dict of differences each) and name the factor that
    keeps the most of them from being used; ``missing``: declared things held nowhere."""
    usable, unusable = 0, []
    for differences in held:
        if differences:
            unusable.append(differences)
        else:
            usable += 1
    total = usable + len(unusable)
    if total == 0 and not missing:
        return Prediction(family, "empty", 0, 0, note=note)
    if not unusable and not missing:
        return Prediction(family, "hit", total, usable, note=note)
    outcome: Outcome = "partial" if usable else "miss"
    if not unusable:
        return Prediction(family, outcome, total, usable, missing=missing, note=note)
    firsts = Counter(_first(d) for d in unusable)
    factor, _ = min(firsts.items(), key=lambda item: (-item[1], _rank(item[0])))
    mine, stored = next(d[factor] for d in unusable if _first(d) == factor)
    return Prediction(
        family, outcome, total, usable, factor, _shown(mine), _shown(stored), missing, note
    )


def _first(differences: Differences) -> str:
    return min(differences, key=_rank)


def _rank(factor: str) -> tuple[int, str]:
    group = factor.split(" ", 1)[0] if factor.startswith(("env ", "path ")) else factor
    return (FACTORS.index(group) if group in FACTORS else len(FACTORS), factor)


def _shown(value: object) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 120 else text[:117] + "..."


FINGERPRINT_FACTORS = {
    "software.torch": "torch",
    "software.triton": "Triton version",
    "software.triton_hash": "Triton build",
    "hardware.gpu_name": "GPU model",
    "hardware.compute_capability": "compute capability",
    "software.cuda_runtime": "CUDA",
    "software.driver": "driver",
    "software.ptxas": "ptxas",
    "kernel_hash": "kernel source",
}
"""A fingerprint's fields by the factor they are; the others (SM count, GPUs per node,
NVLink, memory) are named as their field."""


def fingerprint_differences(
    differences: Mapping[str, tuple[object, object]],
) -> dict[str, tuple[object, object]]:
    """``Fingerprint.diff``'s fields under their factors' names."""
    return {FINGERPRINT_FACTORS.get(k, k): v for k, v in differences.items()}
