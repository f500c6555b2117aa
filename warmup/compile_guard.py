"""Moved to :mod:`warmup.serving.compile_guard` (the serving runtime's room); this name
is kept for one release and warns when imported."""

import warnings

from warmup.serving.compile_guard import CompileGuard, RequestCompileError, guard_from_settings

__all__ = ["CompileGuard", "RequestCompileError", "guard_from_settings"]
warnings.warn(
    "warmup.compile_guard is now warmup.serving.compile_guard; the old name goes in the "
    "next release",
    DeprecationWarning,
    stacklevel=2,
)
