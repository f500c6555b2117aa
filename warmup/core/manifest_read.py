"""A manifest's text, read in bounded time and memory, before anything validates it.

The file is read by one bounded read (at most one byte over :data:`MAX_MANIFEST_BYTES`;
a fifo or a socket is refused, never waited on), the text decoded as UTF-8 (a BOM is
accepted) and loaded as plain YAML by :mod:`warmup.core.plain_yaml`. Each refusal is a
:class:`~warmup.core.manifest_errors.ManifestError`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from warmup.core import plain_yaml
from warmup.core.manifest_errors import ManifestError, at_most

MAX_MANIFEST_BYTES = 1 << 20


def read_bounded(path: Path) -> bytes:
    """The file's bytes; :class:`ManifestError` when it cannot be read, is no regular
    file or is over the limit. At most one byte over the limit is read: a huge file (or
    /dev/zero) is never read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a fifo must not block the open
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(file.fileno())
            if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                raise ManifestError(str(path), ["not a regular file (a fifo or a socket)"])
            data = file.read(MAX_MANIFEST_BYTES + 1)
            size = st.st_size
    except OSError as e:
        raise ManifestError(str(path), [f"cannot read: {e}"]) from None
    if len(data) > MAX_MANIFEST_BYTES:
        found = size if size >= len(data) else None
        raise ManifestError(
            str(path), [plain_yaml.too_big(found, MAX_MANIFEST_BYTES, "a manifest")]
        )
    return data


def plain_data(text: str | bytes, source: str) -> Any:
    """The manifest's text (or its UTF-8 bytes) as plain data, not yet validated;
    :class:`ManifestError` with the limit it passes or the YAML error (with its caret)."""
    try:
        return plain_yaml.load(plain_yaml.decode(text, MAX_MANIFEST_BYTES, "a manifest"), source)
    except plain_yaml.Refused as e:
        raise ManifestError(source, at_most(list(e.args))) from None
