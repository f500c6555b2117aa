"""The names the registry files things under, each checked by one pattern (``fullmatch``)
wherever it is read: a name that passes here is safe as one path component."""

from __future__ import annotations

import re

SHA256 = re.compile(r"[0-9a-f]{64}")  # a blob's digest, in hex
TRITON_CACHE_KEY = re.compile(r"[A-Za-z0-9_=-]{1,128}")  # Triton's hashes: base32 or hex
MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")  # a compiled model's, as a manifest names it
