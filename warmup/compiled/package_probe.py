"""A package proven to load and run in a fresh process before it is stored.

Loading an AOTInductor package is native code: a package that does not suit the
process (a torch build whose loader crashes on it, a driver that cannot load its
kernels) kills the process, where an exception would only cost a fallback. A server
must never be the first to find that out, so the warmup (same image, same versions)
loads each package it makes in a child process and calls it once at the smallest
declared shape, on zeros of its weights' shapes; a package whose child crashes or fails
is recorded as failed (stage ``load``) and ``auto`` serves the model through
``torch.compile``.

    python -m warmup.compiled.package_probe PROBE_JSON      # the child's side
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 300.0


def probe(package: Path, entry: Any, weights: dict[str, tuple[list[int], str]], device: Any) -> str:
    """'' when a child process loads ``package`` and runs it once at ``entry``'s
    smallest declared shape; else why not (its exit, its last line)."""
    index = getattr(device, "index", None)
    kind = getattr(device, "type", str(device))
    smallest = {name: low for name, (low, _) in entry.ranges().items()}
    asked = {
        "package": str(package),
        "device": kind if index is None else f"{kind}:{index}",
        "weights": weights,
        "inputs": [spec.model_dump(mode="json") for spec in entry.inputs],
        "dims": smallest,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(asked, handle)
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, handle.name],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"its load did not finish in {PROBE_TIMEOUT_S:.0f} s in a fresh process"
    finally:
        Path(handle.name).unlink(missing_ok=True)
    if done.returncode == 0:
        return ""
    last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    return f"it does not load in a fresh process ({how}: {last})"


def _child(asked: dict[str, Any]) -> None:
    import torch  # the child loads the package as a server would

    from warmup.compiled.inputs import torch_dtype  # the child's own, after torch

    device = torch.device(asked["device"])
    index = device.index if device.type == "cuda" else -1
    if device.type == "cuda":
        index = torch.cuda.current_device() if index is None else index
        torch.zeros(1, device=device)  # the context, as a server's weights make it
    loader = torch._C._aoti.AOTIModelPackageLoader(asked["package"], "model", False, 1, index)
    weights = {
        name: torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
        for name, (shape, dtype) in asked["weights"].items()
    }
    if weights:
        loader.load_constants(weights, False, True)
    inputs = []
    for spec in asked["inputs"]:
        size = [asked["dims"][s] if isinstance(s, str) else s for s in spec["shape"]]
        dtype = torch_dtype(spec["dtype"])
        inputs.append(torch.zeros(size, dtype=dtype, device=device))
    with torch.no_grad():
        loader.run(inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    _child(json.loads(Path(sys.argv[1]).read_text()))
