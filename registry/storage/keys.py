"""How far apart two registry keys are: the one rule behind every "nearest" answer (a
tuner's fallback for a miss, a serving op's config for an M with no entry of its own).

Numbers are compared by the log of their ratio (M = 512 is as near to 256 as to 1024);
any other field must be equal, else the keys are infinitely far apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry.core.entry import Entry
    from registry.core.fingerprint import Fingerprint, MatchPolicy

Key = Mapping[str, Any]  # a registry key: field -> number or text
FLOOR = 1e-9  # numbers at or below zero count as this: a distance stays finite


def log_distance(x: float, y: float) -> float:
    """``|log2(x / y)|``: how many doublings apart two positive numbers are."""
    x, y = max(x, FLOOR), max(y, FLOOR)
    return math.log2(max(x, y) / min(x, y))


def key_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """The sum of the numeric fields' log distances; ``inf`` when the keys have other
    fields, or a non-numeric field differs."""
    if set(a) != set(b):
        return math.inf
    total = 0.0
    for name, x in a.items():
        y = b[name]
        if _number(x) and _number(y):
            total += log_distance(x, y)
        elif x != y:
            return math.inf
    return total


def nearest(
    entries: Iterable[Entry],
    kernel: str,
    key: Key,
    fingerprint: Fingerprint,
    policy: MatchPolicy,
) -> Entry | None:
    """The entry of ``kernel`` whose key is nearest to ``key`` among those whose
    fingerprint matches under ``policy``; the first of equals wins."""
    best: tuple[float, Entry] | None = None
    for entry in entries:
        if entry.kernel != kernel or fingerprint.mismatches(entry.fingerprint, policy):
            continue
        distance = key_distance(key, entry.key)
        if math.isfinite(distance) and (best is None or distance < best[0]):
            best = (distance, entry)
    return best[1] if best else None


def best_fit(
    candidates: Mapping[str, Entry], fingerprint: Fingerprint, policy: MatchPolicy
) -> Entry | None:
    """Of one key's entries (by fingerprint digest): the exact fingerprint's, else the one
    ``policy`` allows that differs in the fewest fields (then by identity); None if none."""
    exact = candidates.get(fingerprint.digest())
    if exact is not None:
        return exact
    matching = [e for e in candidates.values() if not fingerprint.mismatches(e.fingerprint, policy)]
    if not matching:
        return None
    return min(matching, key=lambda e: (len(fingerprint.diff(e.fingerprint)), e.identity()))


def without(key: Mapping[str, Any], field: str) -> dict[str, Any]:
    """``key`` less one field: what the keys of one layer share, whatever its M."""
    return {name: value for name, value in key.items() if name != field}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
