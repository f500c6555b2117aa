"""The compile guard: once a serving process is warm, every Triton JIT compile and every
``@triton.autotune`` benchmark run is counted, logged, and in strict mode refused.

Compiles: ``triton.knobs.runtime.jit_cache_hook`` (Triton 3.4+), called before the JIT
compiles or loads from disk a specialisation not in memory; the hook already set is chained.
Triton's compilation listener (``knobs.compilation.listener``, chained too) then says
whether its disk cache had the kernel: such a compile is also counted as a load, which
costs milliseconds where a build costs a second (``built``: the compiles that were not).
Autotune runs: no hook exists, so ``Autotuner.run``/``_bench`` are patched at class level; a
run that benchmarks (key in neither memory nor disk cache) counts once. One process-wide
installation serves every armed guard; the last to disarm undoes it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from registry.core import triton_internals

if TYPE_CHECKING:
    from warmup.compiled.causes import Cause
    from warmup.core.settings import Settings
    from warmup.serving.metrics import ServingMetrics

log = logging.getLogger(__name__)
MAX_LABEL = 120  # kernel names become metric labels: keep them bounded
MAX_DETAIL = 400
FIX = "add its shape to the shape manifest: this variant was not built at warmup"
MODEL = "torch.compile"  # what a compiled model's compile is, beside Triton's own


class RequestCompileError(RuntimeError):
    """A compile or autotune run was refused because the process is already warm: a
    Triton kernel's, or a compiled model's (``what`` is :data:`MODEL`), whose ``causes``
    (``warmup.compiled.causes.Cause``: what differs from priming, and the fix) the
    message names."""

    def __init__(
        self, what: str, kernel: str, detail: str, *, fix: str = FIX,
        causes: Sequence[Cause] = (),
    ) -> None:  # fmt: skip
        self.kernel, self.detail, self.causes = kernel, detail, tuple(causes)
        if what == MODEL:
            said = "; ".join(str(cause) for cause in causes) or "cause not known"
            message = (
                f"model '{kernel}' compiled ({detail}) after the process was declared warm: {said}"
            )
        else:
            message = (
                f"Triton {what} of kernel '{kernel}' ({detail}) after the process was "
                f"declared warm; {fix}"
            )
        super().__init__(f"{message} (TRITON_WARMUP_COMPILE_GUARD=count would only count it).")


class CompileGuard:
    """Counts (and in strict mode refuses) Triton compiles and autotune runs once armed."""

    def __init__(self, *, strict: bool = False, metrics: ServingMetrics | None = None) -> None:
        self.strict = strict
        self.metrics = metrics
        self.compiles: dict[str, int] = {}  # not in memory: built, or loaded from disk
        self.loads: dict[str, int] = {}  # of those, loaded from Triton's disk cache
        self.autotunes: dict[str, int] = {}
        self.models: dict[tuple[str, str], int] = {}  # (model, what) -> count
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        """Compiles plus autotune runs seen while armed (compiled models' included)."""
        with self._lock:
            counts = [*self.compiles.values(), *self.autotunes.values(), *self.models.values()]
            return sum(counts)

    @property
    def built(self) -> dict[str, int]:
        """The compiles that built a kernel (Triton's disk cache did not have it)."""
        with self._lock:
            built = {k: n - self.loads.get(k, 0) for k, n in self.compiles.items()}
        return {k: n for k, n in built.items() if n}

    @property
    def armed(self) -> bool:
        return self in _hooks.armed

    def arm(self) -> None:
        """Install the hooks (once per process) and start counting; idempotent."""
        _hooks.add(self)

    def model_costs(
        self, model: str, costs: Mapping[str, int], causes: Sequence[Cause] = ()
    ) -> None:
        """A call of a declared compiled model compiled after warm (``costs``: the
        non-zero ``warmup.compiled.counters`` of that call; ``causes``: why, with the
        fix, ``warmup.compiled.causes.explain``): counted per model and kind, logged
        with its causes, and in strict mode refused (after the call: Dynamo has no hook
        before)."""
        with self._lock:
            for what, count in costs.items():
                self.models[(model, what)] = self.models.get((model, what), 0) + count
        if self.metrics is not None:
            for what, count in costs.items():
                self.metrics.model_compiles.labels(model, what, self.metrics.rank).inc(count)
        detail = ", ".join(f"{what}={count}" for what, count in sorted(costs.items()))
        said = "; ".join(str(cause) for cause in causes) or "cause not known"
        log.warning("compiled model %s compiled after warm (%s): %s", model, detail, said)
        if self.strict:
            raise RequestCompileError(MODEL, model, detail, causes=causes)

    def disarm(self) -> None:
        """Stop counting; the last guard to disarm restores Triton's previous hooks."""
        _hooks.discard(self)

    @contextlib.contextmanager
    def exempt(self) -> Iterator[None]:
        """Builds the serving code makes on purpose (an op's construction, a new table
        off the request path) on this thread are not request compiles."""
        local = _hooks.local
        local.exempt = getattr(local, "exempt", 0) + 1
        try:
            yield
        finally:
            local.exempt -= 1

    def __enter__(self) -> CompileGuard:
        self.arm()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()

    def _count_load(self, kernel: str) -> None:
        with self._lock:
            self.loads[kernel] = self.loads.get(kernel, 0) + 1
        if self.metrics is not None:
            self.metrics.request_loads.labels(kernel, self.metrics.rank).inc()

    def _count(self, autotune: bool, kernel: str) -> None:
        counts = self.autotunes if autotune else self.compiles
        with self._lock:  # hooks run on whichever thread launches the kernel
            counts[kernel] = counts.get(kernel, 0) + 1
        if self.metrics is not None:
            counter = self.metrics.request_autotunes if autotune else self.metrics.request_compiles
            counter.labels(kernel, self.metrics.rank).inc()


def guard_from_settings(
    settings: Settings, metrics: ServingMetrics | None = None
) -> CompileGuard | None:
    """The guard ``settings.compile_guard`` asks for, not yet armed; None for "off"."""
    if settings.serving.compile_guard == "off":
        return None
    return CompileGuard(strict=settings.serving.compile_guard == "strict", metrics=metrics)


def _report(
    guards: Sequence[CompileGuard], what: str, kernel: str, detail: str, fn: Any = None
) -> None:
    """Count in every armed guard, log once, raise if any guard is strict. ``fn``: the
    JIT function about to compile, whose compile the listener then tells a load or not."""
    kernel = kernel[:MAX_LABEL]
    for guard in guards:
        guard._count(what == "autotune run", kernel)
    log.warning("Triton %s of %s after warm: %s; %s", what, kernel, detail, FIX)
    if any(guard.strict for guard in guards):
        raise RequestCompileError(what, kernel, detail)
    if what == "compile":  # it goes ahead: the listener tells whether it was a load
        _hooks.local.pending = (kernel, fn, guards)


def _describe_key(tuner: Any, meta: Mapping[str, Any]) -> str:
    """The autotune key as the user declared it (``key=[...]``), plus the tensor dtypes
    Triton adds to it."""
    args = {**(getattr(tuner, "nargs", None) or {}), **meta}
    named = ", ".join(f"{k}={args[k]!r}" for k in getattr(tuner, "keys", ()) if k in args)
    dtypes = [str(v.dtype) for v in args.values() if hasattr(v, "dtype")]
    return f"key {named}; dtypes {', '.join(dtypes)}"[:MAX_DETAIL]


class _Hooks:
    """The process-wide installation shared by every armed guard."""

    def __init__(self) -> None:
        self.armed: tuple[CompileGuard, ...] = ()  # replaced whole: hooks read it unlocked
        self.lock = threading.Lock()
        self.hook: Any = None
        self.previous: Any = None
        self.listener: Any = None
        self.previous_listener: Any = None
        self.originals: dict[str, Any] = {}
        self.local = threading.local()  # per thread: in a hook; stack of runs' counted flags

    def add(self, guard: CompileGuard) -> None:
        with self.lock:
            if guard in self.armed:
                return
            if not self.armed:
                self._install()
            self.armed = (*self.armed, guard)

    def discard(self, guard: CompileGuard) -> None:
        with self.lock:
            if guard not in self.armed:
                return
            self.armed = tuple(g for g in self.armed if g is not guard)
            if not self.armed:
                self._uninstall()

    def _install(self) -> None:
        Autotuner = triton_internals.autotuner_class()
        self.previous = triton_internals.jit_cache_hook()
        self.hook = self._compile_hook(self.previous)
        triton_internals.set_jit_cache_hook(self.hook)
        self.previous_listener = triton_internals.compilation_listener()
        self.listener = self._compile_listener(self.previous_listener)
        triton_internals.set_compilation_listener(self.listener)
        missing = [n for n in ("run", "_bench") if not callable(Autotuner.__dict__.get(n))]
        if missing:  # a Triton whose autotuner we do not know: compiles are still guarded
            log.warning("Autotuner lacks %s: autotune runs will not be guarded", missing)
            return
        self.originals = {n: Autotuner.__dict__[n] for n in ("run", "_bench")}
        Autotuner.run = self._wrap_run()  # type: ignore[attr-defined]
        Autotuner._bench = self._wrap_bench()  # type: ignore[attr-defined]

    def _uninstall(self) -> None:
        Autotuner = triton_internals.autotuner_class()
        # Put back only what is still ours: whatever was set on top of ours chains to it,
        # and ours passes straight through while nothing is armed.
        if triton_internals.jit_cache_hook() is self.hook:
            triton_internals.set_jit_cache_hook(self.previous)
        if triton_internals.compilation_listener() is self.listener:
            triton_internals.set_compilation_listener(self.previous_listener)
        for name, original in self.originals.items():
            if getattr(Autotuner.__dict__.get(name), "_compile_guard", False):
                setattr(Autotuner, name, original)
        self.originals = {}

    def _compile_hook(self, previous: Any) -> Any:
        local = self.local

        def on_compile(**hook: Any) -> bool | None:
            """``jit_cache_hook``: the JIT is about to compile (or load from disk) a new
            specialisation; True from the previous hook means it will not."""
            local.pending = None  # a refused or failed compile's never reached the listener
            outer = not getattr(local, "in_hook", False)  # an older hook of ours, re-armed
            local.in_hook = True
            try:
                if previous is not None and previous(**hook):
                    return True
            finally:
                local.in_hook = not outer
            guards = self.armed
            if outer and guards and not getattr(local, "exempt", 0):
                info = hook.get("fn")
                name = getattr(info, "name", None) or str(hook.get("repr"))
                detail = triton_internals.describe_jit_compile(hook, MAX_DETAIL)
                _report(guards, "compile", name, detail, getattr(info, "jit_function", None))
            return None

        return on_compile

    def _compile_listener(self, previous: Any) -> Any:
        local = self.local

        def on_compiled(**event: Any) -> None:
            """Triton's compilation listener: a compile our hook counted was a load when
            the disk cache had the kernel. Only the compile of the function the hook saw
            answers it (another ``triton.compile`` on this thread between, Inductor's,
            does not); one that never comes (a compile on another thread, one that
            failed) leaves the compile counted as built."""
            pending = getattr(local, "pending", None)
            src_fn = getattr(event.get("src"), "fn", None)
            if pending is not None and pending[1] is not None and src_fn is not pending[1]:
                pending = None  # not the compile the hook saw
            elif pending is not None:
                local.pending = None
            if pending is not None and event.get("cache_hit"):
                kernel, _, guards = pending
                for guard in guards:
                    guard._count_load(kernel)
            if previous is not None:
                previous(**event)

        return on_compiled

    def _wrap_run(self) -> Any:
        run, local = self.originals["run"], self.local

        def guarded_run(tuner: Any, *args: Any, **kwargs: Any) -> Any:
            stack = local.__dict__.setdefault("runs", [])
            stack.append(False)
            try:
                return run(tuner, *args, **kwargs)
            finally:
                stack.pop()

        guarded_run._compile_guard = True  # type: ignore[attr-defined]
        return guarded_run

    def _wrap_bench(self) -> Any:
        bench, local = self.originals["_bench"], self.local

        def guarded_bench(tuner: Any, *args: Any, config: Any, **meta: Any) -> Any:
            stack, guards = local.__dict__.get("runs", []), self.armed
            first = guards and not (stack and stack[-1]) and not getattr(local, "exempt", 0)
            if first:  # the first benchmark of this run
                if stack:
                    stack[-1] = True
                kernel = getattr(tuner.base_fn, "__qualname__", str(tuner.fn))
                _report(guards, "autotune run", kernel, _describe_key(tuner, meta))
            return bench(tuner, *args, config=config, **meta)

        guarded_bench._compile_guard = True  # type: ignore[attr-defined]
        return guarded_bench


_hooks = _Hooks()
