"""A server process for the package tests: ``python -m tests.warmup.compiled._package_server
NAME [DIMS_JSON...]`` serves the declared model through ``Serving.model`` (settings from
the environment), calls it at every declared shape and each ``DIMS_JSON``, and prints
how it was served, which compiler modules the process imported, and each call's largest
difference from the model's own eager module (built after the calls) or its refusal."""

from __future__ import annotations

import json
import sys

import torch

from warmup.compiled.inputs import grad_mode, make_inputs
from warmup.serving import Serving

COMPILER = ("torch._dynamo", "torch._inductor.compile_fx")


def every(serving: Serving) -> None:
    """``NAME`` ``*``: every declared model through ``Serving.models``, side by side."""
    served = serving.models(device="cpu")
    serving.declare_warm()
    outputs = {
        name: model(*make_inputs(model.entry, model.entry.expand()[0], "cpu"))
        for name, model in served.items()
    }
    report = {
        "served_as": {name: model.served_as for name, model in served.items()},
        "imported": sorted(m for m in COMPILER if m in sys.modules),
        "shapes": {name: list(out.shape) for name, out in outputs.items()},
    }
    print(json.dumps(report))


def main(name: str, extra: list[dict[str, int]]) -> None:
    if name == "*":
        with Serving(follow=False) as serving:
            every(serving)
        return
    with Serving(follow=False) as serving:
        model = serving.model(name, device="cpu")
        serving.declare_warm()
        entry = model.entry
        calls = []
        for dims in [*entry.expand(), *extra]:
            inputs = make_inputs(entry, dims, "cpu")
            try:
                calls.append((dims, inputs, model(*inputs), None))
            except ValueError as e:
                calls.append((dims, inputs, None, f"{type(e).__name__}: {e}"))
        imported = sorted(m for m in COMPILER if m in sys.modules)
        from warmup.compiled.uncompiled import build_uncompiled

        eager = build_uncompiled(entry, "cpu").model
        errors = []
        for dims, inputs, out, refused in calls:
            if refused is not None:
                errors.append({"dims": dims, "refused": refused})
                continue
            with grad_mode(entry):
                expected = eager(*inputs)
            errors.append({"dims": dims, "max_error": float((out - expected).abs().max())})
    report = {
        "served_as": model.served_as,
        "package_note": getattr(model, "package_note", ""),
        "imported": imported,
        "calls": errors,
        "grad": bool(out is not None and out.requires_grad) if calls else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    torch.set_grad_enabled(True)  # the caller's mode: the served model sets its own
    main(sys.argv[1], [json.loads(arg) for arg in sys.argv[2:]])
