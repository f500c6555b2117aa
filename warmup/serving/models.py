"""A declared compiled model in the server: built by the manifest's own function, so
what is served is what was warmed, on the Inductor cache the warmup filled.

    serving = Serving()                       # one per process (warmup.serving)
    model = serving.model("blocks")           # the manifest's build(device=...), primed
    serving.declare_warm()                    # from here a compile is counted (or refused)
    logits = model(tokens)

Once the process is declared warm, every call reads Dynamo's and Inductor's counters
around itself: a call that compiled (a new shape, a guard that failed, an FX graph cache
miss, a Triton kernel, an autotune benchmark) is counted per model by the compile guard
(``triton_warmup_model_request_compiles``), and refused in strict mode. The counters are
the process's: a compile on another thread during the call (another model's, a kernel's
JIT) is charged to this call too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from registry.errors import named
from warmup.compiled.counters import snapshot
from warmup.compiled.learned import Recorder
from warmup.compiled.warm import build_model, run_once
from warmup.manifest import Manifest, ModelEntry, load_manifest
from warmup.settings import Settings

if TYPE_CHECKING:
    from warmup.serving.compile_guard import CompileGuard

log = logging.getLogger(__name__)


class ServedModel:
    """A declared model's callable; calls pass through, counted once the guard is armed.
    A call that compiled has its dims recorded (``recorder``) for the next pods to warm."""

    def __init__(
        self,
        entry: ModelEntry,
        function: Callable[..., Any],
        guard: CompileGuard | None,
        recorder: Recorder | None = None,
    ) -> None:
        self.entry, self.function, self.guard = entry, function, guard
        self.recorder = recorder

    @property
    def name(self) -> str:
        return self.entry.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.guard is None or not self.guard.armed:
            return self.function(*args, **kwargs)
        before = snapshot()
        output = self.function(*args, **kwargs)
        costs = (snapshot() - before).request_costs()
        if costs:
            if self.recorder is not None:
                self.recorder.record(self.entry, args)
            self.guard.model_costs(self.name, costs)
        return output


def build_served(
    name: str,
    settings: Settings,
    *,
    device: Any,
    guard: CompileGuard | None,
    manifest: Manifest | None = None,
    prime: bool = True,
    recorder: Recorder | None = None,
    learned: list[dict[str, int]] | None = None,
) -> ServedModel:
    """The model declared as ``name`` in ``manifest`` (default: the settings' manifest),
    built on ``device`` with torch.compile reading the pod's Inductor cache, and with
    ``prime`` called once at every declared shape, then at each of ``learned`` (the
    shapes the fleet learned, ``warmup.compiled.learned``: the same list on every rank,
    a failure logged, not fatal). KeyError when the manifest declares no such model,
    ValueError when it cannot be built or fails at a shape."""
    manifest = manifest or load_manifest(settings.manifest)
    entry = manifest.model(name)
    use_inductor_cache(settings)
    served = ServedModel(entry, build_model(entry, device), guard, recorder)
    if prime:
        for dims in entry.expand():
            try:
                run_once(served.function, entry, dims, device)
            except Exception as e:
                raise ValueError(f"at {dims}: {named(e)}") from None
        for dims in learned if learned is not None else []:
            try:
                run_once(served.function, entry, dims, device)
            except Exception as e:  # a learned shape is a bonus: its first request pays
                log.warning("model %s: learned shape %s not primed: %s", name, dims, e)
    return served


def use_inductor_cache(settings: Settings) -> None:
    """Point torch.compile in this process at the pod's Inductor cache (where the warmup
    restored and wrote the artifacts), with its FX graph and AOTAutograd caches on."""
    from warmup.compiled.environment import inductor_environment

    wanted = inductor_environment(settings)
    held = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if held and os.path.abspath(held) != wanted["TORCHINDUCTOR_CACHE_DIR"]:
        log.warning(
            "TORCHINDUCTOR_CACHE_DIR=%s is replaced by the warmup's %s (set "
            "TRITON_WARMUP_INDUCTOR_CACHE_DIR to choose it)",
            held,
            wanted["TORCHINDUCTOR_CACHE_DIR"],
        )
    jit = wanted.pop("CUDA_CACHE_PATH")
    if os.environ.get("CUDA_CACHE_PATH") != jit and _cuda_started():
        log.warning(
            "CUDA started before CUDA_CACHE_PATH=%s was set: torch's first calls JIT-compile "
            "what the warmup cached there; set it in the server's environment (the chart does)",
            jit,
        )
    os.environ.update({**wanted, "CUDA_CACHE_PATH": jit})


def _cuda_started() -> bool:
    import torch

    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
