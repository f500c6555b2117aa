"""The contract between a kernel and the tuner: what one tune task is (:class:`TuneTask`),
and the parts that kernels share, written once (:class:`Task`, :class:`ProductTask`).

The tuner (``warmup.tuning``) calls every method of the contract and finds none by
``getattr``; an adapter's ``tasks`` yields objects that implement it. A task that has
no baseline, accepts every stored config and holds nothing worth dropping takes those
parts from :class:`Task`. Imports neither torch nor triton until a product is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kernels.adapter import dtype_name
from registry.core.config import KernelConfig

# The relative error (in norm) a run may have against a wider-precision reference.
TOLERANCE = {"fp32": 2e-3, "fp16": 1e-2, "bf16": 2e-2}  # by kernels.adapter.DTYPES name


class TuneTask(Protocol):
    """One problem to tune: every rank of a pod builds the same task, and the tuner runs
    them in lockstep."""

    kernel: str

    @property
    def kernel_hash(self) -> str:
        """The public hash of the kernel's source, part of every fingerprint."""
        ...

    def key(self) -> dict[str, Any]:
        """The registry key of this problem: what a stored config depends on."""
        ...

    def candidates(self) -> list[KernelConfig]:
        """The configs to search, the space's default first (policy 'fallback' takes it)."""
        ...

    def run(self, config: KernelConfig) -> Any:
        """One launch with ``config``; returns its output (for :meth:`verify`)."""
        ...

    def verify(self, output: Any) -> str | None:
        """None when ``output`` is right, else why not (one line)."""
        ...

    def warmup(self, config: KernelConfig) -> None:
        """Compile (or load) ``config``'s exact variant, without launching it."""
        ...

    def baseline(self) -> KernelConfig | None:
        """The candidate that stands for what the op replaces (a library call), or None.
        The search keeps it unless a rival beats it beyond noise."""
        ...

    def accepts(self, config: KernelConfig) -> bool:
        """Whether the task can run a stored config (a decorated function whose config
        space changed cannot run one that left it): one it refuses is a miss."""
        ...

    def drop_inputs(self) -> None:
        """Let go of what the task holds for its runs (GPU memory) while it waits for a
        shape another pod tunes; :meth:`remake_inputs` makes it again."""
        ...

    def remake_inputs(self) -> None:
        """Undo :meth:`drop_inputs` before the task runs again. A collective for a task of
        many ranks: every rank of the pod calls it at the same step."""
        ...


def check_contract(task: object) -> None:
    """``TypeError`` naming what ``task`` lacks of :class:`TuneTask`: a task written
    before the contract had its optional parts (baseline, accepts, drop_inputs,
    remake_inputs) takes them from :class:`Task` as a base."""
    missing = [name for name in _CONTRACT if not hasattr(task, name)]
    if missing:
        raise TypeError(
            f"{type(task).__name__} is not a tune task: it has no {', '.join(missing)} "
            "(kernels.task.TuneTask; subclass kernels.task.Task for the optional parts)"
        )


# what TuneTask declares, read from it: its attributes, then its methods
_CONTRACT = (*TuneTask.__annotations__, *(n for n in vars(TuneTask) if not n.startswith("_")))


class Task:
    """The optional parts of :class:`TuneTask`: no baseline, every stored config
    accepted, nothing held to drop."""

    def baseline(self) -> KernelConfig | None:
        return None

    def accepts(self, config: KernelConfig) -> bool:
        return True

    def drop_inputs(self) -> None:
        return None

    def remake_inputs(self) -> None:
        return None


class ProductTask(Task):
    """A task whose runs take two input tensors ``a`` and ``b`` and whose outputs are
    checked against a reference product (:meth:`reference`, kept in ``_expected``).

    ``inputs`` makes ``(a, b)`` again: a task that has it drops its inputs, output and
    reference while it waits, keeping only their shapes (for the key); one without it
    holds the caller's tensors and never drops them. A task whose reference is a
    collective (``collective_reference``) makes it when its inputs are made, on every
    rank together, never inside a check that a failed launch on one rank would skip."""

    a: Any
    b: Any
    inputs: Callable[[], tuple[Any, Any]] | None
    out: Any
    _expected: Any
    collective_reference = False

    def reference(self) -> Any:
        """The product to check a run against, in a wider precision than the inputs'."""
        raise NotImplementedError

    def verify(self, output: Any) -> str | None:
        if self._expected is None:
            if self.collective_reference:
                raise RuntimeError(f"{type(self).__name__}: no reference made with the inputs")
            self._expected = self.reference()
        name = dtype_name(self.a.dtype)
        assert name is not None, f"{type(self).__name__}: no kernel takes {self.a.dtype}"
        return relative_error_reason(output, self._expected, TOLERANCE[name])

    def drop_inputs(self) -> None:
        if self.inputs is None:
            return
        import torch  # torch loads only when a task runs: warmup.tuning imports this without

        self.a, self.b = (torch.empty_like(t, device="meta") for t in (self.a, self.b))
        self.out = self._expected = None

    def remake_inputs(self) -> None:
        if self.inputs is None or not self.a.is_meta:
            return
        self.a, self.b = self.inputs()
        if self.collective_reference:
            self._expected = self.reference()


def relative_error_reason(out: Any, expected: Any, tolerance: float) -> str | None:
    """None when ``out`` is finite and within ``tolerance`` (relative norm) of
    ``expected``, else why not."""
    import torch  # torch loads only when a product is checked

    if not torch.isfinite(out).all():
        return "output has NaN or inf (unwritten or overflowed elements)"
    wide = torch.float64 if expected.dtype == torch.float64 else torch.float32  # norms in >= fp32
    ref = expected.to(wide)
    error = float((out.to(wide) - ref).norm() / ref.norm().clamp_min(1e-30))
    return None if error <= tolerance else f"relative error {error:.2e} > {tolerance:.0e}"
