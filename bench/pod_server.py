"""One rank of ``bench/pod_ready.py``'s reference server, in a process of its own:

    python -m bench.pod_server --manifest M --device cuda --report rank0.json

with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and
the pod's (``TRITON_WARMUP_*``, the caches). It times every phase to ready (import torch,
the process group, ``Serving()``, each serving op, each model built and primed,
``declare_warm``, every rank ready), whether the compiler's modules were imported at
ready (:data:`COMPILER`) and how each model was served (package or compiled), then the
first request and the steady median at every declared shape, and writes its report as
JSON.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmup.run.phases import process_age  # no torch

DUMP_SIGNAL = signal.SIGUSR1  # pod_ready sends it to a rank past its time limit
# What a process that can compile imports (issue [5.2]): a server of packages needs neither.
COMPILER = ("torch._dynamo", "torch._inductor.compile_fx")


def imported(modules: tuple[str, ...] = COMPILER) -> dict[str, bool]:
    """Whether each of ``modules`` is imported in this process now."""
    return {name: name in sys.modules for name in modules}


def served_as(model: Any) -> str:
    """How the server holds a model: ``package`` or ``compiled`` (``Serving.model``), or
    ``direct`` (built by its function alone: the nccl_eager floor)."""
    return str(getattr(model, "served_as", "direct"))


DIRECT = "BENCH_MODELS_DIRECT"  # "1": models built by their function, not Serving.model


def _direct(entry: Any, device: Any) -> Any:
    """The model its build function returns, run twice at every declared shape under
    its mode: what a server that knows nothing of this product does (no compiler
    imported, no Inductor environment set)."""
    from warmup.compiled.inputs import grad_mode, make_inputs
    from warmup.core.manifest import resolve_model_builder

    model = resolve_model_builder(entry.build)(device=device)
    for dims in entry.expand():
        inputs = make_inputs(entry, dims, device)
        with grad_mode(entry):
            model(*inputs)
            model(*inputs)
    return model


def counts() -> dict[str, int]:
    """Dynamo's and Inductor's counters now (zero while Dynamo is not imported: its
    counters start with it), with this process's Triton compiles (counted without
    Dynamo, which a server with no compiled model never imports)."""
    from warmup.compiled.counters import CompileCounts, snapshot, triton_compiles

    now = snapshot() if "torch._dynamo" in sys.modules else CompileCounts()
    return {**now.to_json(), "kernel_compiles": triton_compiles()}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


@dataclass(frozen=True)
class OpLayer:
    """One serving op's layer, from the manifest's kernel entries: its declared Ms."""

    kernel: str
    n: int
    k: int
    dtype: str
    ms: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.kernel} N{self.n} K{self.k}"


def op_layers(manifest: Any, world: int) -> list[OpLayer]:
    """The layers of ``manifest``'s kernel entries made for ``world`` ranks, in order."""
    found: dict[tuple[str, int, int, str], set[int]] = {}
    for entry in manifest.entries:
        if entry.world_size != world:
            continue
        for shape in entry.expand():
            found.setdefault((entry.kernel, shape["N"], shape["K"], entry.dtype), set()).add(
                shape["M"]
            )
    return [
        OpLayer(kernel, n, k, dtype, tuple(sorted(ms)))
        for (kernel, n, k, dtype), ms in found.items()
    ]


def serve(args: argparse.Namespace) -> dict[str, Any]:
    """One rank of the reference server: every phase to ready timed, then the first
    request and the steady median at every declared shape."""
    from warmup.core.manifest import load_manifest

    start = start_rank(args.device)
    phases, lap, torch, dist = start.phases, start.lap, start.torch, start.dist
    rank, world, device, serving = start.rank, start.world, start.device, start.serving
    started_at = start.started_at
    manifest = load_manifest(serving.settings.paths.manifest)
    phases["serving"] += lap()
    before = counts()
    ops = []
    for layer in op_layers(manifest, world):
        op = serving.op(
            layer.kernel, n=layer.n, k=layer.k, dtype=layer.dtype, max_m=max(layer.ms),
            device=device, on_missing="fallback",
        )  # fmt: skip
        ops.append((layer, op))
        phases[f"op {layer.label}"] = lap()
    models = []
    direct = os.environ.get(DIRECT) == "1"  # nccl_eager: the model as a plain server holds it
    for entry in manifest.models:
        model = _direct(entry, device) if direct else serving.model(entry.name, device=device)
        models.append((entry, model))
        phases[f"model {entry.name}"] = lap()
    serving.declare_warm()
    phases["declare_warm"] = lap()
    _synchronize(torch, device)
    dist.barrier()
    phases["ready_barrier"] = lap()
    ready_at = time.time()
    compiler = imported()  # before counts(), which could import what it reads
    at_ready = counts()
    shapes = _requests(ops, models, world, device, args.iters)
    after = counts()
    report = {
        "rank": rank,
        "started_at": started_at,
        "ready_at": ready_at,
        "phases": phases,
        "shapes": shapes,
        "counts": {"priming": _delta(before, at_ready), "after_ready": _delta(at_ready, after)},
        "guard": _guard(serving.guard),
        "imported": compiler,
        "served_as": {entry.name: served_as(model) for entry, model in models},
        "tuned_ms": {layer.label: list(op.table.buckets) for layer, op in ops},
        "host": _host(torch, device),
    }
    serving.close()
    dist.destroy_process_group()
    return report


@dataclass
class RankStart:
    """A rank of a bench's server once started: its phases so far (``python``,
    ``import_torch``, ``process_group``, ``serving``) and the lap that times the next,
    torch and its ``dist``, the rank, the world, its device and its ``Serving``."""

    started_at: float  # the interpreter's start, by the wall clock
    phases: dict[str, float]
    lap: Callable[[], float]
    torch: Any
    dist: Any
    rank: int
    world: int
    device: Any
    serving: Any


def start_rank(device_type: str) -> RankStart:
    """Every phase of a rank's start timed, as a server pays them: the interpreter,
    ``import torch``, the process group (torchrun's environment), ``Serving()``."""
    age = process_age()  # the interpreter's start, before this line
    started_at = time.time() - age
    phases: dict[str, float] = {"python": age}
    lap = _lapper()
    import torch
    import torch.distributed as dist

    phases["import_torch"] = lap()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = _join(dist, torch, device_type, int(os.environ["LOCAL_RANK"]))
    phases["process_group"] = lap()
    from warmup.serving import Serving

    serving = Serving()
    phases["serving"] = lap()
    return RankStart(started_at, phases, lap, torch, dist, rank, world, device, serving)


def _lapper() -> Callable[[], float]:
    """Seconds since the last call (the first: since this was made)."""
    last = [time.perf_counter()]

    def lap() -> float:
        now = time.perf_counter()
        seconds, last[0] = now - last[0], now
        return seconds

    return lap


def _join(dist: Any, torch: Any, device_type: str, local_rank: int) -> Any:
    """This rank's device, the process group joined (NCCL on a GPU, bound to it)."""
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def _synchronize(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _requests(
    ops: list[tuple[OpLayer, Any]],
    models: list[tuple[Any, Any]],
    world: int,
    device: Any,
    iters: int,
) -> dict[str, dict[str, float]]:
    """Per declared shape: the first request after ready (every shape's first, in
    order, before any steady call) and the median of ``iters`` calls after 3, inputs
    rotated among 4 sets. Every rank calls in the same order (the ops are collectives)."""
    from warmup.compiled.inputs import make_inputs

    calls: dict[str, list[Callable[[], Any]]] = {}
    for layer, op in ops:
        for m in layer.ms:
            sets = [_op_inputs(layer, m, world, device, seed) for seed in range(1, 5)]
            calls[f"{layer.label} M{m}"] = [functools.partial(op, *s) for s in sets]
    for entry, model in models:
        for dims in entry.expand():
            inputs = [make_inputs(entry, {**dims, "_set": i}, device) for i in range(1, 5)]
            label = f"{entry.name} " + " ".join(f"{k}{v}" for k, v in dims.items())
            calls[label] = [functools.partial(model, *s) for s in inputs]
    timed_ms(_no_request(device), device)  # the timer's own first use is no request's
    _in_step(device)  # a request reaches every rank at once: no rank's set-up is timed
    first = {label: timed_ms(each[0], device) for label, each in calls.items()}
    shapes = {}
    for label, each in calls.items():
        times = [timed_ms(each[i % len(each)], device) for i in range(iters + 3)][3:]
        steady = statistics.median(times)
        shapes[label] = {
            "first_ms": first[label],
            "steady_ms": steady,
            "ratio": first[label] / steady,
        }
    return shapes


def _op_inputs(layer: OpLayer, m: int, world: int, device: Any, seed: int) -> tuple[Any, Any]:
    """An op's inputs at ``m`` rows in all: this rank's shard ``[m / world, K]`` and
    ``b: [K, N]``."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[layer.dtype]
    generator = torch.Generator().manual_seed(seed * 1_000_003 + m)
    a_shard = torch.randn(m // world, layer.k, generator=generator, dtype=dtype)
    b = torch.randn(layer.k, layer.n, generator=generator, dtype=dtype) / layer.k**0.5
    return a_shard.to(device), b.to(device)


def _in_step(device: Any) -> None:
    """Every rank here, its device idle: the ranks start the first requests together
    (the ops are collectives: a rank still making its inputs would be timed otherwise)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    _synchronize(torch, device)


def _no_request(device: Any) -> Callable[[], Any]:
    """A kernel of one element: the events' and the stream's first use, timed once
    before the first request so that it is not counted in it."""
    import torch

    one = torch.zeros(1, device=device)
    return functools.partial(one.add_, 1)


def timed_ms(call: Callable[[], Any], device: Any) -> float:
    """One call's milliseconds: CUDA events on a GPU (host stalls between them count:
    the GPU waits), the wall clock on the CPU."""
    import torch

    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        call()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    clock = time.perf_counter()
    call()
    return (time.perf_counter() - clock) * 1e3


def _guard(guard: Any) -> dict[str, Any] | None:
    """What the compile guard counted after ``declare_warm``."""
    if guard is None:
        return None
    return {
        "compiles": sum(guard.compiles.values()),
        "built": sum(guard.built.values()),
        "autotunes": sum(guard.autotunes.values()),
        "models": {f"{model}:{what}": n for (model, what), n in guard.models.items()},
    }


def _host(torch: Any, device: Any) -> dict[str, str]:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--report", required=True)
    args = parser.parse_args(argv)
    faulthandler.register(DUMP_SIGNAL, all_threads=True)  # the bench's time limit: a stack dump
    from registry.core import atomic

    atomic.write_json(Path(args.report), serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
