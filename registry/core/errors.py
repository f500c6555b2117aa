"""The project's domain exceptions: each names the key, the value and the limit.

Their bases say how the command line ends on one (``warmup.cli.exit_code``): a
:class:`BadInput` exits 2, a :class:`WorkFailed` (every :class:`RegistryError`) 1, each
as its message alone. This module imports nothing heavy: the command line classifies by
these classes without torch, triton or pydantic.
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from registry.core.entry import Entry

_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 3, 6, 6
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 60, 60, 40


def shown(value: object) -> str:
    """``repr`` cut short: an error message quotes a value, never a megabyte of it."""
    return _SHOWN.repr(value)


def named(e: BaseException) -> str:
    """An exception as its type and its whole message: ``ValueError: bad shape``."""
    return f"{type(e).__name__}: {e}"


def first_line(e: BaseException, limit: int = 300) -> str:
    """An exception as :func:`named` gives it, its first line only, at most ``limit``
    characters: a reason for one log or status line."""
    text = named(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:limit]


def why(e: BaseException) -> str:
    """An exception as its type and its message, cut short, for a reason."""
    return f"{type(e).__name__}: {short(str(e))}"


def short(text: str) -> str:
    """``text``, or its start and length if it is longer than 160 characters."""
    return text if len(text) <= 160 else f"{text[:120]}... ({len(text)} characters)"


class ReportedError(Exception):
    """An error the command line reports as its message alone, on one line; its exit
    code follows from its class (:class:`BadInput` or :class:`WorkFailed`)."""


class BadInput(ReportedError):
    """The user's input, settings or host cannot be used (a path, an option, a key, a
    port): exit 2, and nothing written."""


class WorkFailed(ReportedError):
    """The work itself failed (a store that refused a write, a lock not acquired): exit 1."""


class RegistryError(WorkFailed):
    """A registry operation that cannot go on: bad input, an unreadable store, a refused write."""


class LockTimeout(RegistryError):
    """A lock was not acquired in time; the message names the lock and its holder."""

    def __init__(self, name: str, timeout: float, holder: str) -> None:
        super().__init__(f"Lock '{name}' not acquired within {timeout:g} s; held by {holder}.")
        self.name = name
        self.timeout = timeout
        self.holder = holder


class Superseded(RegistryError):
    """A fenced put refused: the entry's file changed after the writer looked (another
    holder of its lock, old or new, stored it first); nothing was written."""

    def __init__(self, path: str, *, held: Entry | None = None) -> None:
        super().__init__(
            f"Entry {path} changed since this writer looked (another holder stored it "
            "first); nothing written."
        )
        self.path = path
        self.held = held  # the entry that holds it now, where known (the remote tier's)


class BundleRejected(RegistryError, BadInput):
    """A bundle failed verification; nothing from it was installed."""

    def __init__(self, bundle: str, reason: str) -> None:
        super().__init__(f"Bundle '{bundle}' rejected: {reason}")
        self.bundle = bundle
        self.reason = reason


class FingerprintMismatch(RegistryError):
    """An entry's fingerprint does not match the one it is used with."""

    def __init__(self, what: str, differences: dict[str, tuple[object, object]]) -> None:
        fields = ", ".join(f"{k}: {a!r} != {b!r}" for k, a, b in _rows(differences))
        super().__init__(f"{what}: fingerprint differs in {fields}")
        self.differences = differences


def _rows(differences: dict[str, tuple[object, object]]) -> list[tuple[str, object, object]]:
    return [(k, a, b) for k, (a, b) in sorted(differences.items())]
