"""What priming a model declared ``inference_mode`` with both kinds of input costs, and
that a server's calls then compile nothing: ``python -m tests.warmup.serving._prime_kinds
[DEVICE] [BUILD]`` (default ``cpu mlp_dynamic``; a builder of tests.warmup.compiled.models)
primes the MLP at batch 1, 4 and 16 in a fresh process on an empty Inductor cache, then
in two more on that cache, and prints one JSON line per process: each kind's priming
seconds, the FX-graph hits and misses, and the compile costs of calls made as servers
make them (under ``torch.inference_mode()``, with inference and normal tensors, at
declared and in-between batches)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MANIFEST = (
    "version: 1\nmodels:\n  - name: m\n    build: tests.warmup.compiled.models:{build}\n"
    "    mode: inference_mode\n    dims: {{batch: [1, 4, 16], seq: 3}}\n    inputs:\n"
    "      - {{shape: [batch, seq, 32], dtype: fp32}}\n"
    "      - {{shape: [batch], dtype: int64, high: 3}}\n"
)


def one_process(root: Path, device_name: str, build: str) -> dict[str, object]:
    import torch

    from tests.conftest import settings_for, write_manifest
    from warmup.compiled.counters import snapshot
    from warmup.compiled.inputs import input_kinds, make_inputs
    from warmup.serving import priming
    from warmup.serving.models import build_served

    device = torch.device(device_name)
    path = write_manifest(root / "manifest.yaml", MANIFEST.format(build=build))
    settings = settings_for(root, manifest=path, device=device_name)
    served = build_served("m", settings, device=device, guard=None, prime=False)
    before, seconds = snapshot(), {}
    for kind in input_kinds(served.entry):
        started = time.perf_counter()
        for dims in served.entry.expand():
            inputs = make_inputs(served.entry, dims, device, inference=kind == "inference")
            priming._until_steady(served.function, served.entry, dims, inputs, device)
        seconds[kind] = round(time.perf_counter() - started, 3)
    primed = snapshot() - before
    after = snapshot()
    for batch in (1, 3, 16):
        for inference in (True, False):
            with torch.inference_mode():
                dims = {"batch": batch, "seq": 3}
                served(*make_inputs(served.entry, dims, device, inference=inference))
    return {
        "prime_s": seconds,
        "fxgraph_hits": primed.fxgraph_hits,
        "fxgraph_misses": primed.fxgraph_misses,
        "served_costs": (snapshot() - after).request_costs(),
    }


def main(device: str = "cpu", build: str = "mlp_dynamic") -> None:
    root = Path(tempfile.mkdtemp(prefix="prime-kinds-"))
    for run in ("cold", "warm", "warm"):
        code = (
            "import json, sys; from pathlib import Path; "
            "from tests.warmup.serving._prime_kinds import one_process; "
            "print(json.dumps(one_process(Path(sys.argv[1]), sys.argv[2], sys.argv[3])))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(root), device, build], capture_output=True, text=True
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        print(json.dumps({"run": run, **json.loads(lines[-1])}) if lines else done.stderr[-3000:])


if __name__ == "__main__":
    main(*sys.argv[1:])
