"""The status file: what the warmup run reports, what the readiness probe reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from registry import atomic

RUNNING, READY, FAILED = "running", "ready", "failed"


def write_status(path: Path, **fields: Any) -> dict[str, Any]:
    """Atomically replace the status file (a reader sees the old one or the new one)."""
    atomic.write_json(path, fields)
    return fields


def read_status(path: Path) -> dict[str, Any] | None:
    """The status, or None when there is none yet or it is unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
