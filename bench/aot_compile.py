"""PyTorch's ahead-of-time compile (``torch.compile(...).aot_compile``) of the 4-block
model of issue [3.1], against its uncompiled first calls. One GPU:

    PYTHONPATH=. python bench/aot_compile.py --out aot_compile.json

Three fresh processes, each with its own empty Inductor and Triton caches and home:

save:   ``aot_compile`` of the model's bound ``forward`` (``fullgraph=True``,
        ``dynamic=False``) at each batch shape, under ``no_grad``, each saved with
        ``save_compiled_function`` (the module is external data); the eager outputs are
        kept as the reference
load:   at another path, each artifact loaded (``torch.compiler.load_compiled_function``,
        timed: ``load_s``) and called once (``first_s``), checked against the reference,
        then ``steady_ms`` (median of 30, device events); what Dynamo and Inductor counted
eager:  the model uncompiled, its first calls and steady time

Where the installed torch gates the feature (2.11: ``torch._dynamo.config.
enable_aot_compile``), it is turned on. A shape whose save or load fails says why.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
BATCHES = (1, 4, 16)
SEQ, WIDTH = 128, 2048


def process(mode: str, folder: Path) -> dict[str, Any]:
    """One of the three processes, in this process (``torch`` imported here)."""
    import torch

    if hasattr(torch._dynamo.config, "enable_aot_compile"):
        torch._dynamo.config.enable_aot_compile = True
    from bench.compiled_models import _blocks
    from warmup.compiled.counters import snapshot

    device = torch.device("cuda")
    model = _blocks(device)
    out: dict[str, Any] = {"mode": mode, "import_s": time.perf_counter() - STARTED}
    out["torch"] = torch.__version__
    before = snapshot()

    def inputs(batch: int) -> Any:
        generator = torch.Generator(device="cpu").manual_seed(batch)
        return torch.randn(batch, SEQ, WIDTH, generator=generator).to(device, torch.float16)

    def steady(function: Any, batch: int) -> float:
        x, times = inputs(batch), []
        with torch.no_grad():
            for _ in range(30):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                function(x)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    folder.mkdir(parents=True, exist_ok=True)
    per: dict[int, dict[str, Any]] = {}
    if mode == "save":
        for batch in BATCHES:
            x = inputs(batch)
            clock = time.perf_counter()
            try:
                with torch.no_grad():
                    compiled = torch.compile(model.forward, fullgraph=True, dynamic=False)
                    function = compiled.aot_compile(((x,), {}))
                function.save_compiled_function(
                    str(folder / f"b{batch}.bin"), external_data={"model": model}
                )
                size = (folder / f"b{batch}.bin").stat().st_size
                per[batch] = {"aot_s": time.perf_counter() - clock, "bytes": size}
            except Exception as e:
                per[batch] = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
            with torch.no_grad():
                torch.save(model(x).float().cpu(), folder / f"ref{batch}.pt")
    elif mode == "load":
        loaded = {}
        for batch in BATCHES:
            x = inputs(batch)
            try:
                clock = time.perf_counter()
                with (folder / f"b{batch}.bin").open("rb") as file:
                    loaded[batch] = torch.compiler.load_compiled_function(
                        file, external_data={"model": model}
                    )
                load_s = time.perf_counter() - clock
                clock = time.perf_counter()
                with torch.no_grad():
                    y = loaded[batch](x)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - clock
                error = (y.float().cpu() - torch.load(folder / f"ref{batch}.pt")).abs().max()
                per[batch] = {"load_s": load_s, "first_s": first_s, "max_err": float(error)}
            except Exception as e:
                per[batch] = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
        out["load_plus_first_s"] = sum(
            p.get("load_s", 0) + p.get("first_s", 0) for p in per.values()
        )
        out["steady_ms"] = {batch: steady(function, batch) for batch, function in loaded.items()}
    else:
        clock = time.perf_counter()
        with torch.no_grad():
            for batch in BATCHES:
                model(inputs(batch))
        torch.cuda.synchronize()
        out["first_s"] = time.perf_counter() - clock
        out["steady_ms"] = {batch: steady(model, batch) for batch in BATCHES}
    out["per"] = per
    out["counts"] = (snapshot() - before).to_json()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process", choices=("save", "load", "eager"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="aot_compile.json")
    args = parser.parse_args()
    if args.process:
        print(json.dumps(process(args.process, args.folder)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="aot-compile-"))
    rows = []
    for mode, pod in (
        ("save", root / "a"),
        ("load", root / "elsewhere" / "b"),
        ("eager", root / "c"),
    ):
        pod.mkdir(parents=True)
        if mode == "load":  # the artifacts, at another path
            shutil.copytree(root / "a" / "art", pod / "art")
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(pod / "inductor-cache"),
            "TRITON_CACHE_DIR": str(pod / "triton-cache"),
            "HOME": str(pod / "home"),
        }
        command = [sys.executable, "-m", "bench.aot_compile", "--process", mode]
        done = subprocess.run(
            [*command, "--folder", str(pod / "art")], env=env, capture_output=True, text=True
        )
        row = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {}
        rows.append(row or {"mode": mode, "error": done.stderr[-2000:]})
        print(json.dumps(rows[-1]), flush=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
