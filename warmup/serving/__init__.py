"""The serving runtime: what runs inside the inference server once the pod is warm.

- :mod:`warmup.serving.ops`: ``Serving``, one per process; its serving ops
  (:mod:`warmup.serving.serving_op`) take a tuned config per call from an in-memory
  table (:mod:`warmup.serving.table`), kept current by :mod:`warmup.serving.follower`;
- :mod:`warmup.serving.compile_guard`: every Triton compile or autotune run after
  ``declare_warm`` counted, or refused;
- :mod:`warmup.serving.metrics`: the process's metrics file, re-exported by the sidecar.
"""

from warmup.serving.compile_guard import CompileGuard, RequestCompileError
from warmup.serving.metrics import ServingMetrics
from warmup.serving.ops import Serving, ServingError, ServingOp

__all__ = [
    "CompileGuard",
    "RequestCompileError",
    "Serving",
    "ServingError",
    "ServingMetrics",
    "ServingOp",
]
