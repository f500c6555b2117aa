"""A declared model's inputs at one shape: random tensors of the declared sizes and
dtypes on the rank's device, the same on every rank and every run (seeded by shape);
normal tensors, or inference tensors (made under ``torch.inference_mode()``), the kinds
a model is primed with (:func:`input_kinds`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from typing import Any

from warmup.core.manifest import ModelEntry

_FLOATS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_INTEGERS = {"int64": "int64", "int32": "int32", "bool": "bool"}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a manifest input's dtype name (``bf16``, ``int64``...)."""
    import torch  # torch loads on first use

    return getattr(torch, _FLOATS.get(name) or _INTEGERS[name])


def make_inputs(
    model: ModelEntry, dims: dict[str, int], device: Any, *, inference: bool = False
) -> list[Any]:
    """One tensor per declared input, sized by ``dims``: floats from a normal
    distribution, integers in ``[0, high)``, booleans either; made under
    ``torch.inference_mode()`` when ``inference`` (inference tensors)."""
    import torch  # torch loads on first use

    with torch.inference_mode() if inference else contextlib.nullcontext():
        return _tensors(model, dims, device)


def _tensors(model: ModelEntry, dims: dict[str, int], device: Any) -> list[Any]:
    import torch  # torch loads on first use

    seed = int.from_bytes(
        hashlib.sha256(json.dumps(dims, sort_keys=True).encode()).digest()[:7], "big"
    )
    generator = torch.Generator().manual_seed(seed)  # on the CPU: any device gets the same
    tensors = []
    for spec in model.inputs:
        size = spec.sized(dims)
        if spec.dtype in _FLOATS:
            tensor = torch.randn(
                size, generator=generator, dtype=getattr(torch, _FLOATS[spec.dtype])
            )
        else:
            high = 2 if spec.dtype == "bool" else spec.high
            tensor = torch.randint(0, high, size, generator=generator).to(
                getattr(torch, _INTEGERS[spec.dtype])
            )
        tensors.append(tensor.to(device))
    return tensors


@contextlib.contextmanager
def grad_mode(model: ModelEntry) -> Iterator[None]:
    """The autograd mode the model is called under, warmed, primed and served alike:
    Dynamo guards on grad mode and on inference mode, so a call under another one would
    compile again. Both are set, whatever the caller's: ``no_grad`` and ``grad`` also
    leave an enclosing ``torch.inference_mode()``."""
    import torch  # torch loads on first use

    inference, grad = model.mode == "inference_mode", model.mode == "grad"
    with torch.inference_mode(inference), torch.set_grad_enabled(grad):
        yield


KINDS = ("normal", "inference")
"""The kinds of input tensors Dynamo tells apart (it guards on a tensor's dispatch keys):
normal ones, and inference tensors, made under ``torch.inference_mode()``."""


def input_kinds(model: ModelEntry) -> tuple[str, ...]:
    """The kinds of inputs ``model`` is primed with, each a graph of its own: normal
    tensors, and for a model declared ``inference_mode`` inference tensors too (what a
    server that makes its inputs under ``torch.inference_mode()`` sends)."""
    return KINDS if model.mode == "inference_mode" else KINDS[:1]


def current_mode() -> str:
    """The caller's autograd mode, as a manifest names it: ``inference_mode``, ``grad``
    (grad enabled) or ``no_grad``."""
    import torch  # torch loads on first use

    if torch.is_inference_mode_enabled():
        return "inference_mode"
    return "grad" if torch.is_grad_enabled() else "no_grad"
