"""The pod's time to ready, end to end (issues [4.1], [5.2]): the product's headline number.

    PYTHONPATH=. python bench/pod_ready.py --world 1 --out pod_ready_w1.json
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python bench/pod_ready.py --world 2 --out pod_ready_w2.json
    PYTHONPATH=. python bench/pod_ready.py --device cpu --models small_mlp --cases nccl_eager

A pod is the chart's: its native sidecar (``triton-warmup serve``, harvest on), the init
container's ``triton-warmup run`` (its own processes; ``TRITON_WARMUP_MODELS_ON_MISS`` as
the chart's default, ``server``), then a reference server (``bench/pod_server.py``):
``--world`` rank processes (torchrun's environment; NCCL on a GPU, gloo on the CPU), each
importing torch, joining the process group, making ``Serving()``, a serving op per layer of
the manifest's kernel entries, each declared model (``Serving.model``: built and primed),
then ``declare_warm()``. The pod is ready when every rank is; its seconds count from the
pod's start (its first process's launch). Each pod has its own work dir, Triton and
Inductor caches and HOME, as the chart gives it. The server-only cases have no sidecar
and no init container.

Cases (``--cases``), per model (``--models``) at one world size:

cold:        the server alone, empty caches, no warmup
persisted:   the server alone on Inductor's and Triton's dirs kept at one path (a PVC as
             cache dir): a first run fills them (not counted), the best of 3 reuses counts
first_pod:   a fleet's first pod: init on an empty volume, then its server
warm_fleet:  a later pod: fresh dirs, the volume a copy of the first pod's at another path
             (taken once the first pod's sidecar has harvested what its server compiled)
package:     a warm fleet's pod whose manifest serves every model as its compiled package
             (``serve: package``): the same, after a first pod of that manifest (its init
             container makes the packages; not timed)
remote_only: the same as warm_fleet through the registry's Redis remote tier alone: a
             first pod fills it, a pod on an empty volume restores from it (skipped
             without redis-server)
eager:       the server alone, the model uncompiled
nccl_eager:  the server alone, the model uncompiled with torch's NCCL all-gather + cuBLAS
             in place of the serving op (no kernel entries, no serving op made) and no
             compiler preloaded: what a pod costs with neither this product's op nor a
             compile

Every other case's manifest says ``serve: compiled`` (torch.compile, as before [5.2]).
The models take their weights from a file made once per model in the run's folder
before any pod (``bench.model_weights``; not counted), as a server loads its checkpoint.

``--trust signed`` (issue [4.2]): every pod trusts one fleet key and signs what it
publishes with it (``TRITON_WARMUP_TRUSTED_KEYS``, ``TRITON_WARMUP_SIGNING_KEY``, as the
chart gives them), so a warm pod verifies every Redis value it takes; ``off`` (the
default): the opt-out, ``TRITON_WARMUP_ALLOW_UNSIGNED=true`` (with no key configured,
code from Redis would be refused). The same cases run both ways give signing's added time
to ready.

Each row gives the end-to-end seconds, the init container's wall time and its run's
phases, the server's phases (rank 0; every rank's beside), per declared shape the first
request after ready over the steady median (device events on a GPU), what the server
compiled while priming and after ready (``warmup.compiled.counters`` and the compile
guard), whether any rank had imported ``torch._dynamo`` or
``torch._inductor.compile_fx`` when ready, and how each model was served (package or
compiled). The ratios and [4.1]'s and [5.2]'s targets: ``bench.pod_targets``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.compiled_model import AG_LAYERS, MODELS, kernel_entries, manifest_text, model_dtype
from bench.model_weights import ENV as WEIGHTS_ENV
from bench.pod_server import COMPILER

ROOT = Path(__file__).resolve().parents[1]
CASES = (
    "cold",
    "persisted",
    "first_pod",
    "warm_fleet",
    "package",
    "remote_only",
    "eager",
    "nccl_eager",
)
KERNELS_ONLY = "kernels"  # a manifest of the AllGather-GEMM MLP's layers, no model
DEFAULT_MODELS = "blocks4,blocks4_max_autotune,ag_mlp,ag_mlp_max_autotune,kernels"
EAGER = {
    "blocks4": "bench.compiled_models:blocks4_eager",
    "blocks4_max_autotune": "bench.compiled_models:blocks4_eager",
    "ag_mlp": "bench.compiled_models:ag_mlp_eager",
    "ag_mlp_max_autotune": "bench.compiled_models:ag_mlp_eager",
    "small_mlp": "bench.compiled_models:small_mlp_eager",
}
NCCL_EAGER = {  # the model uncompiled, torch's all-gather + cuBLAS where it has serving ops
    **EAGER,
    "ag_mlp": "bench.compiled_models:ag_mlp_nccl_eager",
    "ag_mlp_max_autotune": "bench.compiled_models:ag_mlp_nccl_eager",
}
# nccl_eager: no compiler imported, the model built by its function as a plain server does
NO_PRELOAD = {"TRITON_WARMUP_SERVING_PRELOAD": "false", "BENCH_MODELS_DIRECT": "1"}
REUSES = 3  # the persisted anchor: best of this many reuses after the filling run
NO_MULTICAST = {  # every process of a world > 1 (NVLink multicast is not lent)
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
TIERED_TRITON_CACHE = "warmup.triton_remote_cache:TieredCacheManager"  # the chart's tritonCache


# ---- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """One pod of a model's run: its folder ``name``, the case it is timed for (None: it
    only prepares another's volume or caches), whether an init container runs first."""

    name: str
    case: str | None
    init: bool
    volume: str  # its volume's folder, under the run's volumes/
    copy_from: str | None = None  # the volume it starts as a copy of (at another path)
    caches: str | None = None  # Triton + Inductor dirs shared with other pods; None: its own
    remote: bool = False  # the registry's remote tier (and Triton's cache on it) is on
    manifest: str = "compiled"  # its manifest's kind (``manifests``): compiled, eager, ...
    feeds: bool = False  # a later pod starts from what its sidecar harvests: wait for it


def plan(cases: list[str]) -> list[Pod]:
    """The pods that measure ``cases``, in the order they run: a fleet's first pod once
    for both first_pod and warm_fleet (timed only for first_pod)."""
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"--cases {','.join(unknown)}: not a case; the cases are {CASES}")
    pods = []
    if "cold" in cases:
        pods.append(Pod("cold", "cold", init=False, volume="cold"))
    if "eager" in cases:
        pods.append(Pod("eager", "eager", init=False, volume="eager", manifest="eager"))
    if "nccl_eager" in cases:
        pods.append(
            Pod("nccl_eager", "nccl_eager", init=False, volume="nccl_eager", manifest="nccl_eager")
        )
    if "persisted" in cases:
        pods.append(Pod("persisted-fill", None, init=False, volume="persisted", caches="pvc"))
        pods += [
            Pod(f"persisted-{i}", "persisted", init=False, volume="persisted", caches="pvc")
            for i in range(1, REUSES + 1)
        ]
    if "first_pod" in cases or "warm_fleet" in cases:
        first = "first_pod" if "first_pod" in cases else None
        feeds = "warm_fleet" in cases
        pods.append(Pod("fleet-a", first, init=True, volume="fleet-a", feeds=feeds))
    if "warm_fleet" in cases:
        pods.append(Pod("fleet-b", "warm_fleet", init=True, volume="fleet-b", copy_from="fleet-a"))
    if "package" in cases:  # a fleet of its own: its first pod's init makes the packages
        pods.append(Pod("package-a", None, True, "package-a", manifest="package", feeds=True))
        pods.append(
            Pod(
                "package-b", "package", True, "package-b", copy_from="package-a", manifest="package"
            )
        )
    if "remote_only" in cases:
        pods.append(Pod("remote-a", None, init=True, volume="remote-a", remote=True, feeds=True))
        pods.append(Pod("remote-b", "remote_only", init=True, volume="remote-b", remote=True))
    return pods


def skipped(model: str, case: str, world: int, remote_missing: str) -> str | None:
    """Why ``case`` cannot be measured for ``model`` at ``world`` ranks, or None."""
    if case in ("eager", "nccl_eager") and model not in NCCL_EAGER:
        return f"{model} has no model to run uncompiled (a kernels-only manifest)"
    if case == "package" and model not in MODELS:
        return f"{model} has no model to serve as a package (a kernels-only manifest)"
    if case == "remote_only" and remote_missing:
        return remote_missing
    return None


def manifests(
    name: str, batches: list[int], seq: int | None, dtype: str, world: int
) -> dict[str, str]:
    """The manifest texts of model ``name``, by kind: ``compiled`` (what the product
    warms, ``serve: compiled``) and, where there is a model, ``package`` (the same,
    ``serve: package``), ``eager`` (the same model uncompiled) and ``nccl_eager`` (the
    model uncompiled with torch's all-gather + cuBLAS: no kernel entries)."""
    if name == KERNELS_ONLY:
        layers = [(kernel, n, k) for kernel, n, k in AG_LAYERS]
        return {
            "compiled": "version: 1\nentries:\n"
            + kernel_entries(layers, batches, seq, dtype, world)
        }
    if name not in MODELS:
        raise ValueError(f"--models {name}: not a model; the models are {[*MODELS, KERNELS_ONLY]}")
    texts = {
        "compiled": manifest_text(name, MODELS[name], batches, seq, dtype, world=world),
        "package": manifest_text(
            name, MODELS[name], batches, seq, dtype, world=world, serve="package"
        ),
    }
    if name in EAGER:
        texts["eager"] = manifest_text(name, EAGER[name], batches, seq, dtype, world=world)
    if name in NCCL_EAGER:
        texts["nccl_eager"] = manifest_text(
            name, NCCL_EAGER[name], batches, seq, dtype, world=world, ops=False
        )
    return texts


# ---- a pod: its folders, its environment, its processes --------------------------------


@dataclass(frozen=True)
class PodDirs:
    """A pod's folders, at the one path every pod's containers see them at (the chart
    mounts them at fixed paths: Triton's keys of the kernels Inductor generates hold
    their source file's path), made empty for each pod; :meth:`retire` moves a finished
    pod's folders aside. The persisted anchor's caches are one folder of their own."""

    work: Path
    home: Path
    triton: Path
    inductor: Path

    @classmethod
    def under(cls, root: Path, pod: Pod) -> PodDirs:
        own = root / "pod"
        shutil.rmtree(own, ignore_errors=True)  # what a pod killed before retire() left
        caches = root / "caches" / pod.caches if pod.caches else own
        dirs = cls(own / "work", own / "home", caches / "triton-cache", caches / "inductor-cache")
        for folder in (dirs.work, dirs.home, dirs.triton, dirs.inductor):
            folder.mkdir(parents=True, exist_ok=True)
        return dirs

    @staticmethod
    def retire(root: Path, pod: Pod) -> Path:
        """The pod's folders moved to ``pods/<name>`` (kept for reading), out of the next
        pod's way."""
        kept = root / "pods" / pod.name
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(kept, ignore_errors=True)
        (root / "pod").rename(kept)
        return kept


def pod_env(
    dirs: PodDirs,
    *,
    volume: Path,
    manifest: Path,
    device: str,
    world: int,
    remote_url: str = "",
    models_on_miss: str = "server",
    base: dict[str, str] | None = None,
    keys: Path | None = None,
    weights: Path | None = None,
) -> dict[str, str]:
    """The environment of a pod's processes, as the chart sets it (init and server alike):
    this environment less any ``TRITON_WARMUP_*`` of the caller's, then the pod's own;
    ``weights``: the folder of the run's model weights (``bench.model_weights``)."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if not k.startswith("TRITON_WARMUP_")}
    env.pop("TRITON_CACHE_MANAGER", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH", "")]))
    env.update(
        {
            "TRITON_WARMUP_VOLUME": str(volume),
            "TRITON_WARMUP_CREATE_VOLUME": "true",
            "TRITON_WARMUP_MANIFEST": str(manifest),
            "TRITON_WARMUP_WORK_DIR": str(dirs.work),
            "TRITON_WARMUP_TRITON_CACHE_DIR": str(dirs.triton),
            "TRITON_WARMUP_INDUCTOR_CACHE_DIR": str(dirs.inductor),
            "TRITON_WARMUP_METRICS_DIR": str(dirs.work / "serving-metrics"),
            "TRITON_WARMUP_DEVICE": device,
            "TRITON_WARMUP_WORLD_SIZE": str(world),
            "TRITON_WARMUP_COMPILE_GUARD": "count",
            "TRITON_WARMUP_MODELS_ON_MISS": models_on_miss,
            "TRITON_CACHE_DIR": str(dirs.triton),
            "TRITON_CACHE_AUTOTUNING": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(dirs.inductor),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
            "CUDA_CACHE_PATH": str(dirs.inductor / "cuda-jit"),
            "HOME": str(dirs.home),
        }
    )
    if world > 1:
        env.update(NO_MULTICAST)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # the kernels' CPU path
    if remote_url:
        env.update(
            {"TRITON_WARMUP_REMOTE_URL": remote_url, "TRITON_CACHE_MANAGER": TIERED_TRITON_CACHE}
        )
    if keys is not None:  # --trust signed: the fleet's key, trusted and signing
        env["TRITON_WARMUP_TRUSTED_KEYS"] = str(keys / "trusted")
        env["TRITON_WARMUP_SIGNING_KEY"] = str(keys / "fleet.key")
    else:  # --trust off: the opt-out, so pods share unsigned code as they did before [5.3]
        env["TRITON_WARMUP_ALLOW_UNSIGNED"] = "true"
    if weights is not None:
        env[WEIGHTS_ENV] = str(weights)
    return env


def fleet_keys(root: Path) -> Path:
    """A fleet's key pair under ``root/keys``, its public key the one trusted."""
    from registry.trust import signing

    keys = root / "keys"
    signing.generate(keys, "fleet")
    (keys / "trusted").mkdir()
    shutil.copy(keys / "fleet.pub", keys / "trusted" / "fleet.pub")
    return keys


def make_weights(model: str, device: str, folder: Path) -> None:
    """The weight file of ``model`` on ``device``, made in ``folder`` (once per run, in a
    process of its own: the driver imports no torch)."""
    command = [sys.executable, "-m", "bench.model_weights", model, device]
    env = {**os.environ, WEIGHTS_ENV: str(folder)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    subprocess.run(command, env=env, cwd=ROOT, check=True)


def run_init(env: dict[str, str], manifest: Path, work: Path, timeout_s: float) -> dict[str, Any]:
    """``triton-warmup run``, the init container: its wall time (process start to exit),
    exit code, and what its status file says."""
    command = [sys.executable, "-m", "warmup", "run", "--manifest", str(manifest)]
    clock = time.perf_counter()
    [code] = _run_all([command], [env], [work / "init.log"], timeout_s)
    wall = time.perf_counter() - clock
    status_file = work / "status.json"
    status = json.loads(status_file.read_text()) if status_file.exists() else {}
    row = {
        "wall_s": wall,
        "rc": code,
        "state": status.get("state"),
        "full_hit": status.get("full_hit"),
        "phases": status.get("phases", {}),
        "benchmark_runs": status.get("benchmark_runs"),
    }
    if code != 0:
        row["error"] = _tail(work / "init.log")
    return row


def run_server(
    env: dict[str, str], manifest: Path, work: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The reference server's ranks, torchrun-like; each rank's report (its own
    ``error`` where it failed, the log's tail where it wrote none)."""
    port = free_port()
    ranks = range(args.world)
    envs = [
        {
            **env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(args.world),
            "LOCAL_WORLD_SIZE": str(args.world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        for rank in ranks
    ]
    command = [sys.executable, "-m", "bench.pod_server", "--manifest", str(manifest)]
    command += ["--device", args.device, "--iters", str(args.iters)]
    commands = [[*command, "--report", str(work / f"server-{rank}.json")] for rank in ranks]
    logs = [work / f"server-{rank}.log" for rank in ranks]
    codes = _run_all(commands, envs, logs, args.timeout, dump=True)
    return [_report(work, rank, code) for rank, code in zip(ranks, codes, strict=True)]


GRACE_S = 30.0  # after one rank fails, how long the others have (they may wait on it)


def _run_all(
    commands: list[list[str]],
    envs: list[dict[str, str]],
    logs: list[Path],
    timeout_s: float,
    *,
    dump: bool = False,
) -> list[int | None]:
    """Run the commands together, each in a session of its own (so that ending one ends
    what it started: a launcher's ranks, a compiler's workers), output to its log; each
    exit code (negative: ended by a signal, ours at the time limit or after a peer
    failed). ``dump``: a command still running at the end is asked for its threads'
    stacks first (``bench.pod_server.DUMP_SIGNAL``), into its log."""
    procs = []
    try:
        for command, env, log in zip(commands, envs, logs, strict=True):
            with open(log, "w") as out:
                procs.append(
                    subprocess.Popen(
                        command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs):  # a failure: its peers get a grace period
                deadline = min(deadline, time.monotonic() + GRACE_S)
            time.sleep(0.01)  # the init's wall time is read to 10 ms
    finally:
        if dump:
            _dump_stacks(procs)
        for proc in procs:
            _end(proc)
    return [proc.returncode for proc in procs]  # negative: ended by that signal


def _dump_stacks(procs: list[subprocess.Popen[bytes]]) -> None:
    from bench.pod_server import DUMP_SIGNAL

    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, DUMP_SIGNAL)
    if running:
        time.sleep(1.0)  # faulthandler writes at once; a second is ample


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc``'s session if it is still running: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
            return


def _report(work: Path, rank: int, code: int | None) -> dict[str, Any]:
    path = work / f"server-{rank}.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    return {"rank": rank, "error": f"exit {code}, no report: {_tail(work / f'server-{rank}.log')}"}


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the driver ---------------------------------------------------------------------------


@dataclass
class Context:
    """One model's run: its folder, manifests and the remote tier's URL."""

    model: str
    root: Path
    manifests: dict[str, Path]
    remote_url: str
    args: argparse.Namespace


def run_pod(pod: Pod, ctx: Context) -> dict[str, Any]:
    """One pod, timed from its first process's launch to every rank ready. A pod with
    an init container has the chart's native sidecar too (``triton-warmup serve``,
    harvesting what the server compiles), started first and stopped when the pod is
    done (for a pod that ``feeds`` another, once its harvest is written)."""
    dirs = PodDirs.under(ctx.root, pod)
    volume = ctx.root / "volumes" / pod.volume
    if pod.copy_from:  # the fleet's state before this pod starts: not its time
        shutil.copytree(
            ctx.root / "volumes" / pod.copy_from, volume, symlinks=True, dirs_exist_ok=True
        )
    manifest = ctx.manifests[pod.manifest]
    env = pod_env(
        dirs, volume=volume, manifest=manifest, device=ctx.args.device, world=ctx.args.world,
        remote_url=ctx.remote_url if pod.remote else "", models_on_miss=ctx.args.models_on_miss,
        keys=ctx.args.keys, weights=getattr(ctx.args, "weights", None),
    )  # fmt: skip
    if pod.manifest == "nccl_eager":
        env.update(NO_PRELOAD)
    row: dict[str, Any] = {"model": ctx.model, "world": ctx.args.world, "case": pod.case}
    row["pod"] = pod.name
    started = time.time()
    sidecar = start_sidecar(env, dirs.work) if pod.init else None
    try:
        row.update(_init_and_server(pod, env, manifest, dirs, ctx, started))
        if sidecar is not None and pod.feeds and not row.get("error"):
            row["harvest_wait_s"] = wait_quiet([volume, dirs.triton, dirs.inductor])
    finally:
        if sidecar is not None:
            _end(sidecar)
            row["sidecar_rc"] = sidecar.returncode
        PodDirs.retire(ctx.root, pod)
    return row


def _init_and_server(
    pod: Pod, env: dict[str, str], manifest: Path, dirs: PodDirs, ctx: Context, started: float
) -> dict[str, Any]:
    """The init container (if the pod has one), then the server: the row's figures."""
    row: dict[str, Any] = {}
    if pod.init:
        row["init"] = run_init(env, manifest, dirs.work, ctx.args.timeout)
        if row["init"]["rc"] != 0:
            return {
                **row,
                "error": f"init exit {row['init']['rc']}: {row['init'].get('error', '')}",
            }
    server_started = time.time()
    reports = run_server(env, manifest, dirs.work, ctx.args)
    failed = [r for r in reports if r.get("error")]
    if failed:
        return {**row, "error": f"rank {failed[0].get('rank')}: {failed[0]['error']}"}
    ready_at = max(r["ready_at"] for r in reports)
    head = reports[0]
    return {
        **row,
        "ready_s": ready_at - started,
        "server_s": ready_at - server_started,
        "phases": head["phases"],
        "ranks": [r["phases"] for r in reports],
        "shapes": head["shapes"],
        "counts": head["counts"],
        "guard": head["guard"],
        "imported": {  # at ready, on any rank
            module: any(r.get("imported", {}).get(module, False) for r in reports)
            for module in head.get("imported", {})
        },
        "served_as": head.get("served_as", {}),
        "tuned_ms": head["tuned_ms"],
        "host": head["host"],
    }


def start_sidecar(env: dict[str, str], work: Path) -> subprocess.Popen[bytes]:
    """``triton-warmup serve`` as the chart runs it, harvest on, on a free local port."""
    sidecar_env = {
        **env,
        "TRITON_WARMUP_HARVEST": "true",
        "TRITON_WARMUP_METRICS_HOST": "127.0.0.1",
        "TRITON_WARMUP_METRICS_PORT": str(free_port()),
    }
    with open(work / "sidecar.log", "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "warmup", "serve"], env=sidecar_env, cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


# the harvest saves the Inductor cache after 5 s of quiet (harvest_queue.INDUCTOR_QUIET_S)
QUIET_S = 10.0


def wait_quiet(folders: list[Path], quiet_s: float = QUIET_S, limit_s: float = 180.0) -> float:
    """Wait until no file under ``folders`` has changed for ``quiet_s``, counted from
    this call at the earliest (at most ``limit_s``): the sidecar's harvest of what the
    server compiled is written. Folders quiet since long before do not end the wait: a
    harvest starved of CPU while the server's ranks ran may not have begun. Returns the
    seconds waited."""
    clock, since = time.monotonic(), time.time()
    while time.monotonic() - clock < limit_s:
        newest = max((_newest(folder) for folder in folders), default=since)
        newest = max(newest, since)
        if time.time() - newest >= quiet_s:
            break
        time.sleep(0.5)
    return time.monotonic() - clock


def _newest(folder: Path) -> float:
    """The latest modification time under ``folder`` (a file vanishing meanwhile skipped)."""
    newest = 0.0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            newest = max(newest, path.stat().st_mtime)
    return newest


def bench_model(
    model: str, cases: list[str], ctx: Context, rows: list[dict[str, Any]], say: Callable[[], None]
) -> None:
    """Every runnable case of ``cases`` for ``model``, a row each appended to ``rows``
    (persisted: its best reuse, with every reuse's seconds); ``say()`` after each pod."""
    runnable, done = [], len(rows)
    remote_missing = "" if ctx.remote_url else ctx.args.remote_missing
    for case in cases:
        why = skipped(model, case, ctx.args.world, remote_missing)
        if why:
            rows.append({"model": model, "world": ctx.args.world, "case": case, "skipped": why})
            _say(rows[-1])
        else:
            runnable.append(case)
    if "remote_only" in runnable:
        _flush(ctx.remote_url)  # another model's run left its entries
    reuses: list[dict[str, Any]] = []
    for pod in plan(runnable):
        try:
            row = run_pod(pod, ctx)
        except Exception as e:  # a pod that broke (a time limit, a full disk): the next may run
            row = {"model": model, "world": ctx.args.world, "case": pod.case, "pod": pod.name}
            row["error"] = f"{type(e).__name__}: {e}"
        _say(row)
        if pod.case == "persisted":
            reuses.append(row)
            if len(reuses) == REUSES:
                rows.append(best_of(reuses))
        elif pod.case is not None:
            rows.append(row)
        elif row.get("error"):  # a pod that prepares a case failed: that case is not timed
            rows.append({**row, "case": PREPARES[pod.name]})
        say()
    rows[done:] = sorted(rows[done:], key=lambda row: CASES.index(row["case"]))  # as CASES


PREPARES = {"persisted-fill": "persisted", "fleet-a": "warm_fleet", "remote-a": "remote_only"}


def best_of(reuses: list[dict[str, Any]]) -> dict[str, Any]:
    """The persisted anchor: its fastest reuse, with every reuse's seconds."""
    timed = [r for r in reuses if r.get("ready_s") is not None]
    if not timed:
        return {**reuses[0], "error": "; ".join(str(r.get("error")) for r in reuses)}
    best = min(timed, key=lambda r: r["ready_s"])
    return {**best, "runs_s": [r.get("ready_s") for r in reuses]}


def _flush(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushall()


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[tuple[str, str]]:
    """A redis-server on a free port for the remote tier: (its URL, ""), or ("", why
    there is none)."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield "", "no redis-server on PATH: the remote tier cannot be measured"
        return
    try:
        import redis
    except ImportError:
        yield "", "redis-py is not installed: the remote tier cannot be measured"
        return
    port = free_port()
    options = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [binary, *options], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        if _answers(redis, url):
            yield url, ""
        else:
            yield "", f"{binary} on port {port} did not answer within 10 s"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _answers(redis: Any, url: str, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.exceptions.ConnectionError):
            return bool(redis.Redis.from_url(url).ping())
        time.sleep(0.05)
    return False


def result_of(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The result file: the setup, every case's row, and the ratios the targets judge."""
    from bench.pod_targets import pod_ratios

    host: dict[str, str] = next((r["host"] for r in rows if r.get("host")), {})
    setup = {
        "device": args.device,
        "world": args.world,
        **host,
        "batches": args.batches,
        "seq": args.seq,
        "iters": args.iters,
        "models_on_miss": args.models_on_miss,
        "trust": getattr(args, "trust", "off"),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    return {"bench": "pod_ready", "setup": setup, "pods": rows, "ratios": pod_ratios(rows)}


def table(result: dict[str, Any]) -> list[str]:
    """A markdown row per case: end to end, init, the server's phases, compiles, the
    compiler's modules imported at ready, how the models were served."""
    lines = [
        "| model | case | ready s | init s | server s | import torch | process group | "
        "Serving() | ops | models | compiles priming / after ready | worst first ÷ steady | "
        "Dynamo / compile_fx imported | served as |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["pods"]:
        lead = f"| {row['model']} | {row['case']} |"
        if row.get("skipped") or row.get("error"):
            why = row.get("skipped") or f"FAILED: {row['error'][-160:]}"
            lines.append(f"{lead} {why.replace('|', '/').replace(chr(10), ' ')} |" + " |" * 11)
            continue
        phases = row["phases"]
        init = row.get("init", {}).get("wall_s")
        runs = (
            f" (best of {[round(s, 1) for s in row['runs_s'] if s]})" if row.get("runs_s") else ""
        )
        worst = max((s["ratio"] for s in row["shapes"].values()), default=None)
        lines.append(
            f"{lead} {row['ready_s']:.2f}{runs} | {'-' if init is None else f'{init:.2f}'} | "
            f"{row['server_s']:.2f} | {phases['import_torch']:.2f} | "
            f"{phases['process_group']:.2f} | "
            f"{phases['serving']:.2f} | {_sum(phases, 'op '):.2f} | {_sum(phases, 'model '):.2f} | "
            f"{compiles(row['counts']['priming'])} / {compiles(row['counts']['after_ready'])} | "
            f"{'-' if worst is None else f'{worst:.2f}'} | {_imported(row)} | "
            f"{', '.join(sorted(set(row.get('served_as', {}).values()))) or '-'} |"
        )
    return lines


def _imported(row: dict[str, Any]) -> str:
    """``yes``/``no`` for Dynamo, then for ``compile_fx``; ``-``: not reported."""
    found = row.get("imported")
    if not found:
        return "-"
    return " / ".join("yes" if found.get(m) else "no" for m in COMPILER)


def _sum(phases: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in phases.items() if k.startswith(prefix))


def compiles(counts: dict[str, int]) -> str:
    """Dynamo frames / FX graph misses / Triton compiles / autotune benchmarks."""
    keys = ("dynamo_frames", "fxgraph_misses", "kernel_compiles", "autotune_runs")
    return "/".join(str(counts.get(k, 0)) for k in keys)


def _say(row: dict[str, Any]) -> None:
    what = f"  {row['case'] or '(prepares)'} [{row.get('pod', '-')}]"
    if row.get("skipped"):
        print(f"{what}: skipped: {row['skipped']}", flush=True)
    elif row.get("error"):
        print(f"{what}: FAILED {row['error'][-600:]}", flush=True)
    else:
        init = row.get("init", {}).get("wall_s")
        said = f"init {init:.2f} s, " if init is not None else ""
        print(
            f"{what}: ready {row['ready_s']:.2f} s ({said}server {row['server_s']:.2f} s); "
            f"compiles priming {compiles(row['counts']['priming'])}, "
            f"after ready {compiles(row['counts']['after_ready'])}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cases = args.cases.split(",")
    plan(cases)  # an unknown case fails before any pod runs
    batches = [int(b) for b in args.batches.split(",")]
    dtype = model_dtype(args.device)
    root = Path(args.keep or tempfile.mkdtemp(prefix="pod-ready-"))
    root.mkdir(parents=True, exist_ok=True)
    args.keys = fleet_keys(root) if args.trust == "signed" else None
    args.weights = root / "weights"
    rows = kept(args, args.models.split(","), cases) if args.append else []

    def say() -> None:  # the file holds what was measured, if the run is stopped
        Path(args.out).write_text(json.dumps(result_of(rows, args), indent=1))

    try:
        with redis_server(root) if "remote_only" in cases else _no_redis() as (url, missing):
            args.remote_missing = missing
            for model in args.models.split(","):
                print(f"== {model}, world {args.world}", flush=True)
                seq = None if model == "small_mlp" else args.seq
                ctx = Context(model, root / model, {}, url, args)
                for kind, text in manifests(model, batches, seq, dtype, args.world).items():
                    ctx.manifests[kind] = _written(ctx.root / f"manifest-{kind}.yaml", text)
                if model != KERNELS_ONLY:  # before any pod: no pod's time
                    make_weights(model, args.device, args.weights)
                bench_model(model, cases, ctx, rows, say)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    result = result_of(rows, args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    from bench import plots, pod_targets, targets

    plots.save_beside(args.out, "pod_ready", result)
    print("\n".join(["", *table(result), "", targets.table(pod_targets.pod_ready(result))]))
    failed = [f"{row['model']} {row['case']}" for row in result["pods"] if row.get("error")]
    if failed:  # a run whose pods failed is a failed bench, whatever the targets say
        print(f"failed pods: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def kept(args: argparse.Namespace, models: list[str], cases: list[str]) -> list[dict[str, Any]]:
    """``--append``: the rows of ``--out`` that this run does not measure again (other
    models or cases), so that a run split into several commands gives one result; a
    file of another world size or device is refused."""
    path = Path(args.out)
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    setup = old.get("setup", {})
    if (setup.get("world"), setup.get("device")) != (args.world, args.device):
        raise SystemExit(
            f"--append: {path} is a run at world {setup.get('world')} on {setup.get('device')}, "
            f"this one at world {args.world} on {args.device}; give another --out"
        )
    return [r for r in old["pods"] if not (r["model"] in models and r["case"] in cases)]


@contextlib.contextmanager
def _no_redis() -> Iterator[tuple[str, str]]:
    yield "", "remote_only was not asked for"


def _written(path: Path, text: str) -> Path:
    from warmup.core.manifest import parse_manifest

    parse_manifest(text)  # a bad manifest fails here, not in a pod
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--world", type=int, default=1, choices=range(1, 9))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pod's process")
    parser.add_argument("--out", default="pod_ready.json")
    parser.add_argument(
        "--models-on-miss",
        default="server",
        choices=["server", "init"],
        help="TRITON_WARMUP_MODELS_ON_MISS of the pods (the chart's default: server)",
    )
    parser.add_argument("--keep", default="", help="a folder to keep the pods in")
    parser.add_argument(
        "--trust",
        default="off",
        choices=["off", "signed"],
        help="signed: every pod trusts the fleet's key and signs with it (issue [4.2])",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows of --out that this run does not measure (other models or cases)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
