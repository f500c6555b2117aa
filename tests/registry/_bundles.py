"""Helpers for the tests that install hostile bundles (``registry.bundles.bundle.install``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from registry import BundleRejected, Store
from registry.bundles import bundle
from tests._trust import UNSIGNED_OK


def refused(path: Path, store: Path, *, match: str | None = None, **options: Any) -> str:
    """Install ``path`` into a new store at ``store`` (``options``: the install's), which
    must refuse it with a :class:`BundleRejected` matching ``match``; the refusal's text."""
    options.setdefault("trust", UNSIGNED_OK)
    with pytest.raises(BundleRejected, match=match) as caught:
        bundle.install(path, Store(store, create=True), **options)
    return str(caught.value)
