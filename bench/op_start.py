"""The serving op's start, phase by phase (issue [5.2], item 3): what ``Serving()`` and
then ``Serving.op("ag_gemm", ...)`` for each layer cost a rank of a server.

    PYTHONPATH=. python -m bench.op_start --world 2 --device cpu --out op_start_cpu_w2.json
    PYTHONPATH=. python -m bench.op_start --world 1 --out op_start_w1.json
    PYTHONPATH=. python -m bench.op_start --world 2 --out op_start_w2.json   # 2 GPUs

``--world`` rank processes with torchrun's environment (NCCL on a GPU, gloo on the CPU;
``bench/pod_ready.py``'s launcher and pod environment: NVLink multicast off at world > 1),
one Triton cache dir for every run (``--runs 2``: the first compiles, the second loads
what it left, as a pod on a restored cache does). Each rank times ``import torch``, the
process group, ``Serving()``, then each serving op, and inside each op its phases
(:mod:`kernels.startup`: the workspace's mapping, the registry read, the table, the
priming of each config, the rehearsal), with counts (workspaces made and reused, GEMM
shapes primed). A process before the ranks stores a tuned entry per layer at three Ms
(``--tuned``: ``mixed``, one algorithm each, by default; ``fused``, ``baseline`` or
``none``: the untuned fallback) in the pod's registry. ``--check`` runs each op once against a
float64 reference; ``--profile`` adds each rank's cProfile of the ops' start.

The headline is ``op_start_s``: every op's start on the slowest rank, per run (the first
op's includes the fingerprint's detection, as a server's does).
"""

from __future__ import annotations

import argparse
import faulthandler
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.compiled_model import AG_LAYERS, kernel_entries, model_dtype
from bench.pod_server import DUMP_SIGNAL, OpLayer, _op_inputs, start_rank

CPU_LAYERS = [(32, 16), (16, 32)]  # (N, K): the interpreter runs the kernels on the CPU
CPU_ROWS = 16  # rows per rank at most, on the CPU
TUNED = ("mixed", "fused", "baseline", "none")


# ---- one rank -----------------------------------------------------------------------------


def rank_main(args: argparse.Namespace) -> dict[str, Any]:
    """One rank: every phase to its ops made, each op's own phases and counts."""
    start = start_rank(args.device)
    phases, lap, torch, dist = start.phases, start.lap, start.torch, start.dist
    rank, world, device, serving = start.rank, start.world, start.device, start.serving
    from kernels import startup

    layers = _layers(args, world)
    ops, fine = [], {}
    profiler = _profiler(args.profile)
    for layer in layers:
        with startup.recording() as record:
            op = serving.op(
                "ag_gemm", n=layer.n, k=layer.k, dtype=layer.dtype, max_m=max(layer.ms),
                device=device, on_missing="fallback",
            )  # fmt: skip
        phases[f"op {layer.label}"] = lap()
        fine[layer.label] = record.to_json()
        ops.append((layer, op))
    profile = _profile_lines(profiler)
    report = {
        "rank": rank,
        "world": world,
        "phases": phases,
        "op_start_s": sum(v for name, v in phases.items() if name.startswith("op ")),
        "order": list(phases),  # the report's keys are sorted
        "ops": fine,
        "tuned_ms": {layer.label: list(op.table.buckets) for layer, op in ops},
        "configs": {
            layer.label: sorted({c.label() for c in op.table.configs}) for layer, op in ops
        },
        "check": _check(ops, world, device) if args.check else None,
        "profile": profile,
        "host": {"gpu": _gpu(torch, device), "torch": torch.__version__},
    }
    serving.close()
    dist.destroy_process_group()
    return report


def _layers(args: argparse.Namespace, world: int) -> list[OpLayer]:
    """The layers the ops serve, each at its declared Ms (a sixteenth, a quarter and all
    of ``max_m``: where rank 0 stores tuned entries)."""
    from bench.compiled_models import AG_MAX_M  # imports torch: a rank times it first

    dtype = model_dtype(args.device)
    max_m = args.max_m or world * (CPU_ROWS if args.device == "cpu" else AG_MAX_M)
    ms = tuple(sorted({max(world, max_m // 16 // world * world), max_m // 4, max_m}))
    return [OpLayer("ag_gemm", n, k, dtype, ms) for n, k in _shapes(args)]


def _shapes(args: argparse.Namespace) -> list[tuple[int, int]]:
    if args.layer:
        return [tuple(int(v) for v in text.split(",")) for text in args.layer]  # type: ignore[misc]
    return CPU_LAYERS if args.device == "cpu" else [(n, k) for _, n, k in AG_LAYERS]


def setup_main(args: argparse.Namespace) -> None:
    """Before the ranks, in a process of its own (so that no rank has detected the
    fingerprint before its first op): the tuned entries of ``--tuned`` stored under this
    device's fingerprint, in the pod's registry."""
    import torch

    from kernels import ag_gemm
    from registry.core.fingerprint import detect_for
    from warmup.core.services import Services
    from warmup.core.settings import Settings

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    fingerprint = detect_for(device, ag_gemm.ADAPTER.kernel_hash())
    store = Services(Settings()).store()
    store.put_many(_entries(_layers(args, args.world), args.tuned, args.world, fingerprint, device))


def _entries(
    layers: list[OpLayer], tuned: str, world: int, fingerprint: Any, device: Any
) -> list[Any]:
    """A tuned entry per layer at each declared M, under ``fingerprint``."""
    from kernels import ag_gemm
    from registry import Entry, KernelConfig

    fused = _fused_config(device)
    choice = {
        "fused": [fused] * 3,
        "baseline": [ag_gemm.BASELINE_CONFIG] * 3,
        "mixed": [  # every priming path: a library gather, the fused kernel, the overlap
            KernelConfig.make(algorithm=ag_gemm.GATHER_FIRST),
            fused,
            KernelConfig.make(algorithm=ag_gemm.OVERLAP),
        ],
    }[tuned]
    return [
        Entry.make(
            "ag_gemm",
            ag_gemm.ADAPTER.key(m=m, n=layer.n, k=layer.k, dtype=layer.dtype, world=world),
            fingerprint,
            config,
            source="tuned",
        )
        for layer in layers
        for m, config in zip(layer.ms, choice, strict=True)
    ]


def _fused_config(device: Any) -> Any:
    """A fused config both consumers run: small tiles under the interpreter."""
    from registry import KernelConfig

    tile = (16, 16, 16) if device.type == "cpu" else (128, 128, 64)
    meta = dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), tile, strict=True))
    warps, stages = (4, 2) if device.type == "cpu" else (8, 3)
    return KernelConfig.make(
        {**meta, "GROUP_M": 8}, algorithm="fused_pull", num_warps=warps, num_stages=stages
    )


def _check(ops: list[tuple[OpLayer, Any]], world: int, device: Any) -> dict[str, float]:
    """Each op once at its smallest declared M against a float64 reference; every rank's
    shard is the same (one seed), so the gathered A is it ``world`` times."""
    import torch

    errors = {}
    for layer, op in ops:
        m = layer.ms[0]
        a_shard, b = _op_inputs(layer, m, world, device, seed=1)
        out = op(a_shard, b)
        expected = torch.cat([a_shard] * world).double() @ b.double()
        errors[layer.label] = float((out.double() - expected).norm() / expected.norm())
    return errors


def _profiler(on: bool) -> Any:
    if not on:
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _profile_lines(profiler: Any, lines: int = 40) -> list[str] | None:
    """The profile's costliest calls, by cumulative time."""
    if profiler is None:
        return None
    import pstats

    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(lines)
    return text.getvalue().splitlines()


def _gpu(torch: Any, device: Any) -> str:
    return str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu"


# ---- the launcher -------------------------------------------------------------------------


def launch(args: argparse.Namespace) -> dict[str, Any]:
    """``--runs`` runs of ``--world`` ranks over one Triton cache dir; each rank's report."""
    from bench.pod_ready import PodDirs, _report, _run_all, free_port, pod_env

    root = Path(args.root or tempfile.mkdtemp(prefix="op-start-"))
    root.mkdir(parents=True, exist_ok=True)
    layers = _layers(args, args.world)
    manifest = root / "manifest.yaml"  # the kernels the ops serve: the pod's manifest
    entries = [(layer.kernel, layer.n, layer.k) for layer in layers]
    per_rank = [m // args.world for m in layers[0].ms]
    text = kernel_entries(entries, per_rank, None, layers[0].dtype, args.world)
    manifest.write_text("version: 1\nentries:\n" + text)
    caches = root / "caches"
    runs = []
    for run in range(args.runs):
        work = root / f"run{run}"
        dirs = PodDirs(work / "work", work / "home", caches / "triton", caches / "inductor")
        for folder in (dirs.work, dirs.home, dirs.triton, dirs.inductor):
            folder.mkdir(parents=True, exist_ok=True)
        env = pod_env(dirs, volume=root / "volume", manifest=manifest, device=args.device,
                      world=args.world)  # fmt: skip
        if run == 0 and args.tuned != "none":
            setup = [sys.executable, "-m", "bench.op_start", "--as-setup", *_rank_argv(args)]
            setup += ["--world", str(args.world)]
            if _run_all([setup], [env], [root / "setup.log"], args.timeout) != [0]:
                raise SystemExit(f"op_start: the set-up failed; see {root / 'setup.log'}")
        port = free_port()
        envs = [
            {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(args.world),
             "LOCAL_WORLD_SIZE": str(args.world), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)}
            for r in range(args.world)
        ]  # fmt: skip
        command = [sys.executable, "-m", "bench.op_start", "--as-rank", *_rank_argv(args)]
        reports = [work / f"server-{r}.json" for r in range(args.world)]
        commands = [[*command, "--report", str(report)] for report in reports]
        logs = [work / f"server-{r}.log" for r in range(args.world)]
        started = time.perf_counter()
        codes = _run_all(commands, envs, logs, args.timeout, dump=True)
        ranks = [_report(work, r, code) for r, code in enumerate(codes)]
        runs.append({"run": run, "wall_s": time.perf_counter() - started, "ranks": ranks})
        _say(runs[-1])
    return {"args": vars(args), "root": str(root), "runs": runs}


def _rank_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--device", args.device, "--tuned", args.tuned]
    argv += [f"--layer={text}" for text in args.layer or []]
    argv += ["--max-m", str(args.max_m)] if args.max_m else []
    argv += ["--check"] if args.check else []
    return argv + (["--profile"] if args.profile else [])


def _say(run: dict[str, Any]) -> None:
    """One run: the op start of the slowest rank, then rank 0's phases of each op."""
    ranks = [r for r in run["ranks"] if "error" not in r]
    for failed in (r for r in run["ranks"] if "error" in r):
        print(f"run {run['run']} rank {failed['rank']}: {failed['error']}", file=sys.stderr)
    if not ranks:
        return
    slowest = max(r["op_start_s"] for r in ranks)
    print(f"run {run['run']}: op start {slowest:.3f} s (slowest of {len(ranks)} ranks)")
    head = ranks[0]
    for name in head["order"]:
        print(f"  {name:<28} {head['phases'][name]:8.3f} s")
    for label in (name.removeprefix("op ") for name in head["order"] if name.startswith("op ")):
        fine = head["ops"][label]
        print(f"  {label}:")
        for name, seconds in sorted(fine["seconds"].items()):
            print(f"    {name:<26} {seconds:8.3f} s  x{fine['counts'].get(name, 0)}")
        events = {k: v for k, v in fine["counts"].items() if k not in fine["seconds"]}
        if events:
            print(f"    counts: {events}")
    if head.get("check"):
        print(f"  check (relative error): {head['check']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    layer_help = "N,K of a layer (repeat); default: bench.compiled_model.AG_LAYERS"
    parser.add_argument("--layer", action="append", help=layer_help)
    rows_help = "gathered rows; default 4096 per rank on a GPU, 16 on the CPU"
    parser.add_argument("--max-m", type=int, default=0, help=rows_help)
    parser.add_argument("--tuned", default="mixed", choices=TUNED)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--root", help="the bench's folder (default: a new temp dir)")
    parser.add_argument("--out")
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--as-setup", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from registry.core import atomic

    if args.as_setup:
        setup_main(args)
        return 0
    if args.as_rank:
        faulthandler.register(DUMP_SIGNAL, all_threads=True)  # the launcher's time limit
        atomic.write_json(Path(args.report), rank_main(args))
        return 0
    result = launch(args)
    if args.out:
        atomic.write_json(Path(args.out), result)
    failed = any("error" in r for run in result["runs"] for r in run["ranks"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
