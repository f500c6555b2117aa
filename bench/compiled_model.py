"""A compiled model's first calls in a fresh server process, by what the process found
(issue [3.1]). One GPU, world 1:

    PYTHONPATH=. python bench/compiled_model.py --out compiled_model.json
    PYTHONPATH=. python bench/compiled_model.py --device cpu --models small_mlp --batches 1,8

For each model (``bench/compiled_models.py``; default and ``max-autotune`` are two):

producer:  ``triton-warmup run`` on an empty volume: the sidecar's init container
           compiles the declared model at every shape and stores its artifacts
cold:      a server process with empty Inductor and Triton caches (it also saves a
           Mega-Cache blob afterwards, outside its timings)
same_host: a server process on the cold one's own cache folders (the anchor: Inductor's
           own dirs, same host, same paths)
sidecar:   the artifacts the producer stored, restored into a new pod folder at another
           path (timed: the ``restore`` phase), then a server process on them
megacache: a server process with empty caches that loads the cold one's Mega-Cache blob
           (``torch.compiler.load_cache_artifacts``, timed: ``load``) before its calls
eager:     the same model uncompiled, for reference

Every server process reports its phases (``import``: process start to the model's
module imported; ``restore``/``load``; ``build``; ``first_calls``: one call per batch
shape, synchronised; ``steady_ms``: each shape's median of ``--iters`` calls, device
events, inputs rotated) and what Dynamo and Inductor counted during its first calls.
Outputs are checked against the cold process's (same weights, same inputs).
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

from warmup.run.phases import process_age  # no torch

CASES = ("cold", "same_host", "sidecar", "megacache", "eager")
COSTS = ("inductor_compiles", "fxgraph_misses", "kernel_compiles", "autotune_runs")
MODELS = {
    "blocks4": "bench.compiled_models:blocks4",
    "blocks4_max_autotune": "bench.compiled_models:blocks4_max_autotune",
    "small_mlp": "bench.compiled_models:small_mlp",
    "ag_mlp": "bench.compiled_models:ag_mlp",
    "ag_mlp_max_autotune": "bench.compiled_models:ag_mlp_max_autotune",
}
EAGER = {"blocks4": "bench.compiled_models:blocks4_eager"}
WIDTH = {
    "blocks4": 2048,
    "blocks4_max_autotune": 2048,
    "small_mlp": 64,
    "ag_mlp": 2048,
    "ag_mlp_max_autotune": 2048,
}
AG_LAYERS = [("ag_gemm", 8192, 2048), ("ag_gemm", 2048, 8192)]  # (kernel, N, K)
KERNELS = {"ag_mlp": AG_LAYERS, "ag_mlp_max_autotune": AG_LAYERS}


def model_dtype(device: str) -> str:
    """The dtype of the benches' models, their inputs and their kernel entries on
    ``device`` (a device type): fp16 on a GPU, fp32 on the CPU, which has no fast fp16
    GEMM. The manifests and the models (``bench.compiled_models``) both take it from here."""
    return "fp32" if device == "cpu" else "fp16"


def ag_layers(world: int) -> list[tuple[str, int, int]]:
    """The AllGather-GEMM MLP's serving-op layers at ``world`` ranks
    (``bench.compiled_models.ag_mlp``): both GEMMs at world 1; at more, the up
    projection alone, each rank 1/world of the hidden width (N per rank)."""
    if world == 1:
        return AG_LAYERS
    [(kernel, n, k), _] = AG_LAYERS
    return [(kernel, n // world, k)]


def manifest_text(
    name: str,
    build: str,
    batches: list[int],
    seq: int | None,
    dtype: str,
    *,
    world: int = 1,
    serve: str = "compiled",
    ops: bool = True,
) -> str:
    """The manifest of model ``name`` built by ``build``, served as ``serve`` (the
    manifest's ``serve:``; ``compiled``, torch.compile, as before [5.2]), with the kernel
    entries its serving ops read (none where ``ops`` is false: a build that makes no
    serving op); at ``world`` ranks (``bench/pod_ready.py``), M counts every rank's rows:
    each rank's input is one batch of the declared shape."""
    width = WIDTH[name]
    dims = f"{{batch: {batches}" + (f", seq: {seq}}}" if seq else "}")
    shape = f"[batch, seq, {width}]" if seq else f"[batch, {width}]"
    layers = ag_layers(world) if name in KERNELS and ops else []
    entries = kernel_entries(layers, batches, seq, dtype, world)
    ranks = f"    world_size: {world}\n" if world > 1 else ""
    return (
        "version: 1\n"
        + (f"entries:\n{entries}" if entries else "")
        + f"models:\n  - name: {name.replace('_', '-')}\n    build: {build}\n{ranks}"
        f"    serve: {serve}\n"
        f"    dims: {dims}\n    inputs:\n      - {{shape: {shape}, dtype: {dtype}}}\n"
    )


def kernel_entries(
    layers: list[tuple[str, int, int]],
    batches: list[int],
    seq: int | None,
    dtype: str,
    world: int = 1,
) -> str:
    """Manifest entries for ``layers`` ((kernel, N, K) each) at the Ms of ``batches``
    tokens per rank (x ``seq``): the kernels a model's serving ops take their configs
    from, or a kernels-only manifest's."""
    ms = sorted({b * (seq or 1) * world for b in batches})
    return "".join(
        f"  - {{kernel: {kernel}, dtype: {dtype}, world_size: {world}, "
        f"shapes: [{{M: {ms}, N: {n}, K: {k}}}]}}\n"
        for kernel, n, k in layers
    )


# ---- the server process ---------------------------------------------------------------


def serve(args: argparse.Namespace) -> dict[str, Any]:
    """One fresh server process: import, restore or load, build, first calls, steady."""
    started_before = process_age()  # the interpreter's own start, before this line
    clock = time.perf_counter()
    import torch

    from warmup.compiled.counters import snapshot
    from warmup.compiled.warm import build_model, run_once
    from warmup.core.manifest import load_manifest

    entry = load_manifest(Path(args.manifest)).models[0]
    if args.build:
        entry = entry.model_copy(update={"build": args.build})
    __import__(entry.build.partition(":")[0])
    phases = {"import": started_before + time.perf_counter() - clock}
    device = torch.device(args.device)
    if args.load:
        clock = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(args.load).read_bytes())
        phases["load"] = time.perf_counter() - clock
    written_before = _files(args.watch)
    before = snapshot()
    clock = time.perf_counter()
    function = build_model(entry, device)
    phases["build"] = time.perf_counter() - clock
    first: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    for dims in entry.expand():
        clock = time.perf_counter()
        out = run_once(function, entry, dims, device)
        first[json.dumps(dims)] = time.perf_counter() - clock
        outputs[json.dumps(dims)] = out.float().cpu()
    phases["first_calls"] = sum(first.values())
    counts = (snapshot() - before).to_json()
    written = _grouped(_files(args.watch) - written_before)
    compile_times = _compile_times()
    steady = {
        key: _steady_ms(function, entry, json.loads(key), device, args.iters) for key in first
    }
    if args.save_mega:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            Path(args.save_mega).write_bytes(saved[0])
    torch.save(outputs, args.outputs)
    return {
        "phases": phases,
        "first_s": first,
        "steady_ms": steady,
        "counts": counts,
        "written": written,
        "compile_times": compile_times,
    }


def _files(folders: list[str]) -> set[str]:
    found = set()
    for folder in folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                found.add(str(path))
    return found


def _grouped(paths: set[str]) -> dict[str, int]:
    """New files by folder root and suffix: where a process wrote what it compiled."""
    counts: dict[str, int] = {}
    for path in paths:
        parts = Path(path).parts
        root = next((p for p in parts if p in ("inductor-cache", "triton-cache", "home")), "?")
        key = f"{root}:{Path(path).suffix or Path(path).name[:12]}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _compile_times() -> str:
    try:
        from torch._dynamo.utils import compile_times

        return str(compile_times(repr="str", aggregate=True))[-3000:]
    except Exception as e:  # a torch without it
        return f"{type(e).__name__}: {e}"


def _steady_ms(function: Any, entry: Any, dims: dict[str, int], device: Any, iters: int) -> float:
    """The median of ``iters`` calls, device events on a GPU (wall clock on the CPU),
    rotating among 4 input sets (an L2-sized input would be timed from the cache)."""
    import statistics

    import torch

    from warmup.compiled.inputs import grad_mode, make_inputs

    sets = [make_inputs(entry, {**dims, "_set": i}, device) for i in range(4)]
    times = []
    with grad_mode(entry):
        for i in range(iters + 3):
            inputs = sets[i % len(sets)]
            if device.type == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                function(*inputs)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                clock = time.perf_counter()
                function(*inputs)
                elapsed = (time.perf_counter() - clock) * 1e3
            if i >= 3:
                times.append(elapsed)
    return statistics.median(times)


# ---- the driver -----------------------------------------------------------------------


def run_case(
    case: str,
    manifest: Path,
    pod: Path,
    env: dict[str, str],
    args: argparse.Namespace,
    **flags: str,
) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.compiled_model", "serve", "--manifest", str(manifest)]
    command += [
        "--device",
        args.device,
        "--iters",
        str(args.iters),
        "--outputs",
        str(pod / "out.pt"),
    ]
    for name, value in flags.items():
        command += [f"--{name.replace('_', '-')}", value]
    for folder in ("inductor-cache", "triton-cache", "home"):
        command += ["--watch", str(pod / folder)]
    case_env = {
        **os.environ,
        **env,
        "TORCHINDUCTOR_CACHE_DIR": str(pod / "inductor-cache"),
        "TRITON_CACHE_DIR": str(pod / "triton-cache"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "CUDA_CACHE_PATH": str(pod / "inductor-cache" / "cuda-jit"),  # as the chart sets it
        "HOME": str(pod / "home"),
        "TRITON_WARMUP_VOLUME": str(manifest.parent / "volume"),
        "TRITON_WARMUP_CREATE_VOLUME": "true",
        "TRITON_WARMUP_WORK_DIR": str(pod),
        "TRITON_WARMUP_MANIFEST": str(manifest),
        "TRITON_WARMUP_DEVICE": args.device,
    }
    done = subprocess.run(command, env=case_env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"case": case, "error": done.stderr[-2000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"case": case, **result, "outputs": str(pod / "out.pt")}


def producer(manifest: Path, volume: Path, pod: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``triton-warmup run``: the init container that warms and stores the model."""
    env = {
        **os.environ,
        "TRITON_WARMUP_VOLUME": str(volume),
        "TRITON_WARMUP_CREATE_VOLUME": "true",
        "TRITON_WARMUP_WORK_DIR": str(pod),
        "TRITON_WARMUP_MANIFEST": str(manifest),
        "TRITON_WARMUP_DEVICE": args.device,
        "HOME": str(pod / "home"),
    }
    clock = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "warmup.cli", "run"], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - clock
    status = json.loads((pod / "status.json").read_text()) if (pod / "status.json").exists() else {}
    models = status.get("models", [])
    return {
        "case": "producer",
        "wall_s": wall,
        "ready": status.get("state") == "ready",
        "models": models,
        "error": None if done.returncode == 0 else done.stderr[-2000:],
    }


def restore_pod(manifest: Path, volume: Path, pod: Path, device: str) -> float:
    """What a new pod's init container restores for the model, timed: Triton's cache
    and the model's Inductor artifacts, into a folder at another path."""
    from registry.caches import inductor_cache, triton_cache
    from registry.core.fingerprint import detect_for
    from warmup.compiled.key import model_key
    from warmup.core.manifest import load_manifest

    entry = load_manifest(manifest).models[0]
    fingerprint = detect_for(device)  # before the clock: the init container has it already
    clock = time.perf_counter()
    triton_cache.restore(volume / "triton-cache", pod / "triton-cache")
    done = inductor_cache.restore(
        volume / "inductor",
        pod / "inductor-cache",
        model=entry.name,
        key_digest=model_key(entry).digest,
        fingerprint=fingerprint,
    )
    seconds = time.perf_counter() - clock
    if done.index is None:
        raise SystemExit(f"nothing restored for {entry.name}: {done.why_not}")
    return seconds


def bench_model(name: str, args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Every case of ``args.cases`` for one model; each row is written to ``args.out``
    as soon as it is measured (a run stopped at a time limit keeps what it measured)."""
    batches = [int(b) for b in args.batches.split(",")]
    dtype = model_dtype(args.device)
    manifest = root / name / "manifest.yaml"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(manifest_text(name, MODELS[name], batches, args.seq, dtype))
    volume = root / name / "volume"
    cases = args.cases.split(",")
    rows: list[dict[str, Any]] = []

    def add(row: dict[str, Any]) -> None:
        rows.append({**row, "model": name})
        _say(row)
        Path(args.out).write_text(json.dumps([*args.done, *rows], indent=1))

    if "sidecar" in cases or ("same_host" in cases and "cold" not in cases):
        add(producer(manifest, volume, root / name / "producer-pod", args))
    cold, mega = root / name / "cold-pod", root / name / "mega.bin"
    if "cold" in cases:
        add(run_case("cold", manifest, cold, {}, args, save_mega=str(mega)))
    if "same_host" in cases:  # the cold server's own folders, else the producer's
        anchor = cold if "cold" in cases else root / name / "producer-pod"
        add(run_case("same_host", manifest, anchor, {}, args))
    if "sidecar" in cases:
        pod = root / name / "elsewhere" / "sidecar-pod"
        restore_s = restore_pod(manifest, volume, pod, args.device)
        row = run_case("sidecar", manifest, pod, {}, args)
        row.setdefault("phases", {})["restore"] = restore_s
        add(row)
    if "megacache" in cases and mega.exists():
        add(run_case("megacache", manifest, root / name / "mega-pod", {}, args, load=str(mega)))
    if "eager" in cases and name in EAGER:
        add(run_case("eager", manifest, root / name / "eager-pod", {}, args, build=EAGER[name]))
    _check_outputs(rows)
    return rows


def _check_outputs(rows: list[dict[str, Any]]) -> None:
    """Each case's outputs against the cold process's: the same function, every shape."""
    import torch

    reference = next((r for r in rows if r["case"] == "cold" and "outputs" in r), None)
    if reference is None:
        return
    expected = torch.load(reference["outputs"])
    for row in rows:
        if "outputs" not in row:
            continue
        got = torch.load(row["outputs"])
        row["max_rel_error"] = max(
            float((got[k] - expected[k]).norm() / expected[k].norm().clamp_min(1e-12))
            for k in expected
        )


def _say(row: dict[str, Any]) -> None:
    if row.get("error"):
        print(f"  {row['case']}: FAILED {row['error'][-400:]}", flush=True)
        return
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in row.get("phases", {}).items())
    phases = phases or f"wall {row.get('wall_s', 0.0):.1f} s"
    counts = row.get("counts", {})
    said = ", ".join(f"{k} {counts.get(k, '-')}" for k in COSTS)
    print(f"  {row['case']}: {phases}; {said}", flush=True)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the runs, with the targets' ratios per model."""
    lines = [
        "| model | case | import s | restore/load s | first calls s | restore+first s | "
        "steady ms (per shape) | compiles / fx misses / kernels / autotune | max rel err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["case"] == "producer" or row.get("error"):
            continue
        phases = row["phases"]
        extra = phases.get("restore", phases.get("load", 0.0))
        counts = row["counts"]
        steady = " / ".join(f"{v:.2f}" for v in row["steady_ms"].values())
        lines.append(
            f"| {row['model']} | {row['case']} | {phases['import']:.2f} | {extra:.2f} | "
            f"{phases['first_calls']:.2f} | {extra + phases['first_calls']:.2f} | {steady} | "
            f"{counts['inductor_compiles']} / {counts['fxgraph_misses']} / "
            f"{counts['kernel_compiles']} / {counts['autotune_runs']} | "
            f"{_error(row)} |"
        )
    return lines


def _error(row: dict[str, Any]) -> str:
    error = row.get("max_rel_error")
    return "-" if error is None else f"{error:.1e}"  # "-": no cold case to check against


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """[3.1]'s targets per model: sidecar (restore + first calls) <= 1.1x same_host's
    first calls and <= 0.6x megacache's load + first calls; 0 compiles, 0 FX graph
    misses, 0 autotune runs in the sidecar's server."""
    out = []
    for model in sorted({r["model"] for r in rows}):
        case = {r["case"]: r for r in rows if r["model"] == model and not r.get("error")}
        if "sidecar" not in case:
            out.append(f"{model}: sidecar case missing: not measured")
            continue
        side = case["sidecar"]
        paid = side["phases"]["restore"] + side["phases"]["first_calls"]
        if "same_host" in case:
            anchor = case["same_host"]["phases"]["first_calls"]
            out.append(f"{model}: sidecar / same_host = {paid / anchor:.2f} (target <= 1.1)")
        if "megacache" in case:
            mega = case["megacache"]["phases"]
            out.append(
                f"{model}: sidecar / megacache = {paid / (mega['load'] + mega['first_calls']):.2f}"
                " (target <= 0.6)"
            )
        counts = side["counts"]
        zero = all(
            counts[k] == 0
            for k in ("inductor_compiles", "fxgraph_misses", "kernel_compiles", "autotune_runs")
        )
        out.append(
            f"{model}: sidecar server compiles {counts} ({'met' if zero else 'MISSED'}: all 0)"
        )
        if "eager" in case:
            ratio = side["phases"]["first_calls"] / case["eager"]["phases"]["first_calls"]
            out.append(f"{model}: sidecar first calls / eager's = {ratio:.1f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    server = sub.add_parser("serve")
    server.add_argument("--manifest", required=True)
    server.add_argument("--device", default="cuda")
    server.add_argument("--iters", type=int, default=30)
    server.add_argument("--outputs", required=True)
    server.add_argument("--build", default="")
    server.add_argument("--load", default="")
    server.add_argument("--save-mega", default="")
    server.add_argument("--watch", action="append", default=[])
    parser.add_argument("--models", default="blocks4,blocks4_max_autotune")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--out", default="compiled_model.json")
    parser.add_argument("--keep", default="", help="a folder to keep the pods in")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help="which server cases to run; the producer runs for sidecar, and for same_host "
        "without cold (same_host then takes the producer's folders)",
    )
    args = parser.parse_args()
    if args.command == "serve":
        print(json.dumps(serve(args)))
        return 0
    if args.device == "cpu":
        args.seq = None if args.models == "small_mlp" else args.seq
    root = Path(args.keep or tempfile.mkdtemp(prefix="compiled-model-"))
    rows: list[dict[str, Any]] = []
    args.done = rows
    try:
        for name in args.models.split(","):
            print(f"== {name}", flush=True)
            rows += bench_model(name, args, root)
            Path(args.out).write_text(json.dumps(rows, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    from bench import plots  # here: a server process (``serve``) imports only what it times

    plots.save_beside(args.out, "compiled_model", rows)
    print("\n".join(["", *table(rows), "", *verdicts(rows)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
