"""Rank 0 does the registry's work, every rank gets its answer: one shape fails on every
rank alike, so the next collective still matches."""

from __future__ import annotations

from collections.abc import Callable

from registry import RegistryError
from registry.core.errors import named
from warmup.core.collectives import Answer, Lockstep, P
from warmup.tuning.measure import TuneError


def on_leader(
    lockstep: Lockstep,
    work: Callable[[], P],
    kind: type[P],
    *,
    what: str,
    failed: str,
    timeout_s: float,
) -> P:
    """Rank 0 runs ``work`` and every rank gets its result, or every rank raises the
    same :class:`TuneError` (``failed``, then what went wrong) when it failed."""
    mine, result = None, None
    if lockstep.leader:
        try:
            result = work()
            sent = result.model_dump(mode="json") if lockstep.active else None
            mine = Answer(value=sent)  # one process: rank 0 keeps ``result``, sends none
        except Exception as e:  # a store that cannot be read, a lock server gone, ...
            mine = Answer(error=f"{failed}: {_named(e)}")
    agreed = lockstep.share(mine, Answer, what=what, timeout_s=timeout_s)
    if agreed.error is not None:
        raise TuneError(agreed.error)
    return result if result is not None else kind.model_validate(agreed.value)


def _named(error: BaseException) -> str:
    """A registry error as its message (it names what failed), any other with its type."""
    return str(error) if isinstance(error, RegistryError) else named(error)
