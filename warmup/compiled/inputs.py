"""A declared model's inputs at one shape: random tensors of the declared sizes and
dtypes on the rank's device, the same on every rank and every run (seeded by shape)."""

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


def make_inputs(model: ModelEntry, dims: dict[str, int], device: Any) -> list[Any]:
    """One tensor per declared input, sized by ``dims``: floats from a normal
    distribution, integers in ``[0, high)``, booleans either."""
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
