"""Why a call of a primed model compiled, each cause with its fix.

Read from the call itself against what priming ran (the manifest's entry: its dims,
inputs and mode, the kinds of tensors it was primed with, the learned dims): a dim's
value not declared (``batch=1``, where Dynamo's specialisation of sizes 0 and 1 is why
no primed graph serves it), an input's dtype, rank or static size, an inference tensor
(made under ``torch.inference_mode()``) where priming used normal tensors only (a
model declared ``inference_mode`` is primed with both kinds), an input with
``requires_grad=True``. This holds on any torch. Dynamo's own
recompile reasons (its compilation metrics) add the one cause the inputs cannot show,
a grad mode inside the call that differs from priming's, and stand in for the rest:
a guard on something the manifest does not declare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from warmup.compiled.inputs import input_kinds, torch_dtype
from warmup.core.manifest import ModelEntry
from warmup.core.manifest_shapes import Dim, Pow2, Stepped, TensorSpec, dim_values

Kind = Literal[
    "shape", "inputs", "dtype", "tensor kind", "requires_grad", "grad mode", "run time", "unknown"
]
SHOWN_VALUES = 8  # a dim's declared values listed in a message; the rest elided
MAX_REASON = 300  # Dynamo's reason, quoted in one message
CALLER = {"grad": "grad enabled", "no_grad": "torch.no_grad()", "inference_mode": "inference mode"}


@dataclass(frozen=True)
class Cause:
    """One reason a call compiled (``kind``), what differs (``said``) and the ``fix``."""

    kind: Kind
    said: str
    fix: str

    def __str__(self) -> str:
        return f"{self.said} (fix: {self.fix})"


def explain(
    entry: ModelEntry,
    args: Sequence[Any],
    *,
    kwargs: Sequence[str] = (),
    learned: Sequence[dict[str, int]] = (),
    caller: str = "",
    reasons: Sequence[str] = (),
    new_graph: bool = True,
) -> list[Cause]:
    """The causes of a call of ``entry`` with ``args`` (and keyword arguments named
    ``kwargs``) that compiled, never empty. ``learned``: the dims primed beyond the
    declared ones; ``caller``: the grad mode the caller was in (:func:`~warmup.compiled.
    inputs.current_mode`), named where it made the inputs what they are; ``reasons``:
    Dynamo's recompile reasons for the call; ``new_graph``: whether Dynamo compiled a
    frame (else a kernel compiled or tuned inside a primed graph)."""
    found = _signature(entry, args, kwargs)
    found += _tensors(entry, args, caller)
    found += _dims(entry, args, learned)
    if any("grad_mode" in reason for reason in reasons):
        found.append(_grad_mode(entry, caller))
    if found:
        return found
    if not new_graph:
        return [
            Cause(
                "run time",
                "no new graph: a kernel compiled or was tuned at run time inside a primed one "
                "(an autotuner met a size it had not, or max-autotune's coordinate descent)",
                "declare the call's sizes; with max-autotune let the warmup settle the model "
                "(TRITON_WARMUP_MODEL_SETTLE_PASSES)",
            )
        ]
    dynamo = f"; Dynamo: {_quote(reasons[0])}" if reasons else ""
    return [
        Cause(
            "unknown",
            "nothing the manifest declares differs from priming (dims, dtypes, tensor kinds, "
            f"grad mode){dynamo}",
            "TORCH_LOGS=recompiles names the guard that failed (a Python value or attribute "
            "the model reads, a module changed after priming)",
        )
    ]


def _signature(entry: ModelEntry, args: Sequence[Any], kwargs: Sequence[str]) -> list[Cause]:
    """Inputs the manifest does not declare: another count, keyword arguments, a
    non-tensor, a dtype or rank other than declared, a static size other than declared."""
    found = []
    if len(args) != len(entry.inputs):
        found.append(
            Cause(
                "inputs",
                f"the call passes {len(args)} inputs, the manifest declares {len(entry.inputs)}",
                "declare every input the server passes, in order",
            )
        )
    if kwargs:
        found.append(
            Cause(
                "inputs",
                f"the call passes keyword arguments ({', '.join(sorted(kwargs))}), priming none",
                "pass them by position and declare them as inputs",
            )
        )
    for i, (spec, arg) in enumerate(zip(entry.inputs, args, strict=False)):
        found += _one_input(i, spec, arg)
    return found


def _one_input(i: int, spec: TensorSpec, arg: Any) -> list[Cause]:
    where = f"input {i} {_shape(spec)}"
    if not hasattr(arg, "dtype") or not hasattr(arg, "shape"):
        said = f"{where} is {type(arg).__name__}, not a tensor as the manifest declares"
        return [Cause("inputs", said, "pass tensors as declared")]
    found = []
    if arg.dtype != torch_dtype(spec.dtype):
        said = f"{where} is {arg.dtype}, the manifest declares {spec.dtype}"
        found.append(Cause("dtype", said, f"declare dtype {_dtype_name(arg.dtype)} or cast it"))
    if len(arg.shape) != len(spec.shape):
        said = (
            f"{where} has {len(arg.shape)} dims ({list(arg.shape)}), the manifest {len(spec.shape)}"
        )
        return [*found, Cause("inputs", said, "declare the input's shape as the server passes it")]
    for axis, (want, size) in enumerate(zip(spec.shape, arg.shape, strict=True)):
        if isinstance(want, int) and int(size) != want:
            said = f"{where} has size {int(size)} at axis {axis}, the manifest declares {want}"
            found.append(Cause("shape", said, f"declare {int(size)} (or a dim) at axis {axis}"))
    return found


def _tensors(entry: ModelEntry, args: Sequence[Any], caller: str) -> list[Cause]:
    """Inference tensors where priming used normal ones only, inputs that require grad:
    Dynamo guards on both, so either is a graph priming never made. (Normal tensors are
    primed for every mode: one is never the cause.)"""
    kinds = input_kinds(entry)
    tensors = [
        (f"{i} {_shape(spec)}", arg)
        for i, (spec, arg) in enumerate(zip(entry.inputs, args, strict=False))
        if callable(getattr(arg, "is_inference", None))
    ]
    inference = [name for name, arg in tensors if arg.is_inference()]
    grad = [name for name, arg in tensors if getattr(arg, "requires_grad", False)]
    found = []
    if inference and "inference" not in kinds:
        made = " (the caller is in it)" if caller == "inference_mode" else ""
        found.append(
            Cause(
                "tensor kind",
                _subject(inference, "is an inference tensor", "are inference tensors")
                + f", made under torch.inference_mode(){made}; model {entry.name} "
                f"(mode: {entry.mode}) was primed with normal tensors",
                "make its inputs outside torch.inference_mode(), or declare mode: "
                "inference_mode (then it is primed with both kinds)",
            )
        )
    if grad:
        mode = " with grad enabled (the caller's mode)" if caller == "grad" else ""
        found.append(
            Cause(
                "requires_grad",
                _subject(grad, "has requires_grad=True", "have requires_grad=True")
                + f" (a leaf asked for it, or made from one that requires grad{mode}); "
                "priming's inputs do not",
                "pass it .detach()ed"
                + (
                    ""
                    if entry.mode == "grad"
                    else ", or make it under torch.no_grad() or torch.inference_mode()"
                ),
            )
        )
    return found


def _subject(names: list[str], one: str, many: str) -> str:
    """``input 0 [batch, seq] is ...`` or ``inputs 0 [batch], 1 [batch] are ...``."""
    if len(names) == 1:
        return f"input {names[0]} {one}"
    return f"inputs {', '.join(names)} {many}"


def _dims(entry: ModelEntry, args: Sequence[Any], learned: Sequence[dict[str, int]]) -> list[Cause]:
    """Each dim whose value in the call was not primed: not declared, nor in a learned
    shape primed. A dim of two values across inputs is said too."""
    seen: dict[str, int] = {}
    found = []
    for i, (spec, arg) in enumerate(zip(entry.inputs, args, strict=False)):
        shape = getattr(arg, "shape", None)
        if shape is None or len(shape) != len(spec.shape):
            continue  # said by _one_input
        for want, size in zip(spec.shape, shape, strict=True):
            if isinstance(want, str) and seen.setdefault(want, int(size)) != int(size):
                said = f"{want} is {seen[want]} in an earlier input and {int(size)} in input {i}"
                found.append(Cause("shape", said, f"pass inputs of one {want}"))
    if seen in learned:
        return found
    for name, value in seen.items():
        if name in entry.dims and value not in dim_values(entry.dims[name]):
            found.append(_undeclared(name, value, entry.dims[name]))
    return found


def _undeclared(name: str, value: int, dim: Dim) -> Cause:
    said = f"{name}={value} is not declared (the manifest's {name}: {_declared(dim)})"
    if value > 1:
        return Cause("shape", said, f"add {value} to the model's dim {name} in the manifest")
    said += (
        "; Dynamo specialises sizes 0 and 1, so no graph primed at other sizes serves it, "
        "dynamic or not"
    )
    if value == 1:
        return Cause("shape", said, f"add 1 to the model's dim {name} in the manifest")
    return Cause("shape", said, f"skip the call when {name} is 0 (a dim is declared from 1)")


def _grad_mode(entry: ModelEntry, caller: str) -> Cause:
    """Dynamo saw another grad mode inside the call than priming's: the served model sets
    the declared one, so the model's own code (or a call outside it) changed it."""
    theirs = (
        f"; the caller's: {CALLER[caller]}" if caller in CALLER and caller != entry.mode else ""
    )
    return Cause(
        "grad mode",
        f"the grad mode inside the call differs from priming's (mode: {entry.mode}{theirs}; "
        "Dynamo: GLOBAL_STATE changed: grad_mode)",
        "call the compiled module only through the served model, which runs every call in "
        "its declared mode, and do not change the grad mode inside it; or declare the mode "
        "it runs in",
    )


def _declared(dim: Dim) -> str:
    if isinstance(dim, Pow2):
        return f"powers of two from {dim.pow2[0]} to {dim.pow2[1]}"
    if isinstance(dim, Stepped):
        return f"{dim.start} to {dim.stop - 1} by {dim.step}"
    values = dim_values(dim)
    more = ", ..." if len(values) > SHOWN_VALUES else ""
    return ", ".join(str(v) for v in values[:SHOWN_VALUES]) + more


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join(str(size) for size in spec.shape) + "]"


def _dtype_name(dtype: Any) -> str:
    names = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    bare = str(dtype).removeprefix("torch.")
    return names.get(bare, bare)


def _quote(reason: str) -> str:
    one = " ".join(reason.split())
    return one if len(one) <= MAX_REASON else one[: MAX_REASON - 3] + "..."


def dynamo_reasons(frames: int) -> list[str]:
    """Dynamo's recompile reasons of its last ``frames`` compiled frames (its compilation
    metrics, torch 2.5+), first compiles of a frame aside; empty where this torch keeps
    none. Another thread's compile in between may be among them: a hint, not a proof."""
    if frames <= 0:
        return []
    try:
        from torch._dynamo.utils import get_compilation_metrics  # torch loads on first use

        metrics = get_compilation_metrics()[-frames:]
    except Exception:  # another torch's internals: the inputs still say what they can
        return []
    reasons = (getattr(m, "recompile_reason", None) for m in metrics)
    return [r for r in reasons if isinstance(r, str) and r]
