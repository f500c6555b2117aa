"""Time to ready of a fleet of pods that warm together, against one pod alone (issue 2.6).

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    PYTHONPATH=. python bench/fleet.py --pods 2 --ranks 1 --out fleet-2x1.json  # 2 GPUs
    PYTHONPATH=. python bench/fleet.py --pods 4 --ranks 1 --out fleet-4x1.json  # 4 GPUs
    PYTHONPATH=. python bench/fleet.py --pods 2 --ranks 2 --out fleet-2x2.json  # 4 GPUs
    PYTHONPATH=. python bench/fleet.py --device cpu --shapes '64,48,32;128,48,32;64,96,32'

The three variables must be set on a machine of several GPUs (NVLink multicast off);
every pod inherits this environment.

solo:    one pod of R ranks (GPUs 0..R-1) running ``triton-warmup run`` on an empty volume
volume:  N pods started together on one shared empty volume (file locks in it); pod i
         sees GPUs i*R .. i*R+R-1 and has its own work folder
redis:   N pods started together, each on its own empty volume, sharing only a
         redis-server this bench starts (the fleet locks, and the registry's remote tier)

A pod's time to ready runs from the common start to its process's exit. The target: the
slowest pod within 0.6x solo for 2 pods, 0.35x for 4 pods of 1 rank, and every shape
tuned exactly once in the fleet; on GPUs only (a CPU run checks the logic: its pods share
the host's cores). Default shapes: the 8 of bench/cold_start.py.
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import bytecode
from bench.cold_start import SHAPES, manifest_text
from warmup.core.results import RunStatus
from warmup.run.gpus import listed_gpus
from warmup.run.phases import phase_table

Shape = tuple[int, int, int]
MODES = ("solo", "volume", "redis")
POD_LIMIT_S = 4000.0  # past the launcher's own run limit (3600 s): a hung pod is killed
# Settings the bench decides for each pod; one left in the environment would blur a mode.
OWNED = (
    "VOLUME",
    "MANIFEST",
    "WORK_DIR",
    "DEVICE",
    "LOCK_URL",
    "REMOTE_URL",
    "REGISTRY_DIR",
    "STATUS_FILE",
    "TRITON_CACHE_DIR",
    "WORLD_SIZE",
)


def target(pods: int, ranks: int) -> float | None:
    """The issue's bound on slowest pod / solo for this fleet; None where it sets none."""
    if pods == 2:
        return 0.6
    if pods == 4 and ranks == 1:
        return 0.35
    return None


@dataclass
class Pod:
    """One pod's run: its time to ready and what its status file says."""

    index: int
    seconds: float  # from the common start to the process's exit
    code: int | None  # None: killed at POD_LIMIT_S
    state: str  # the status's state, or "no status"
    tuned: float  # shapes this pod tuned (status rows with source tuned, per rank)
    sources: dict[str, int] = field(default_factory=dict)
    benchmark_runs: int = 0
    remote: dict[str, int] | None = None
    phases: dict[str, float] = field(default_factory=dict)
    tuned_s: dict[str, float] = field(default_factory=dict)  # shape -> its tuning, max over ranks
    failures: list[str] = field(default_factory=list)
    stderr_tail: str = ""


@dataclass
class Mode:
    """One mode's pods and its checks against the solo run."""

    name: str
    pods: list[Pod] = field(default_factory=list)
    skipped: str | None = None

    @property
    def slowest(self) -> Pod:
        return max(self.pods, key=lambda p: p.seconds)

    def checks(self, shapes: int, solo_s: float | None, bound: float | None) -> dict[str, Any]:
        if not self.pods:
            return {"skipped": self.skipped}
        tuned = sum(p.tuned for p in self.pods)
        ready = all(p.state == "ready" for p in self.pods)
        ratio = self.slowest.seconds / solo_s if solo_s else None
        met = None if ratio is None or bound is None or self.name == "solo" else ratio <= bound
        return {
            "all_ready": ready,
            "tuned_in_fleet": tuned,
            "tuned_once": tuned == shapes,
            "slowest_s": self.slowest.seconds,
            "slowest_over_solo": ratio,
            "target": None if self.name == "solo" else bound,
            "target_met": None if met is None else met and ready and tuned == shapes,
            "benchmark_runs": sum(p.benchmark_runs for p in self.pods),
        }


def parse_shapes(text: str) -> list[Shape]:
    """``M,N,K;M,N,K`` -> shapes."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        dims = [int(d) for d in part.split(",")]
        if len(dims) != 3 or min(dims) < 1:
            raise SystemExit(f"--shapes: {part!r} is not M,N,K of positive integers")
        shapes.append((dims[0], dims[1], dims[2]))
    return shapes


def gpu_ids(needed: int, *, share: bool = False) -> list[str]:
    """The GPUs the pods split, in order: CUDA_VISIBLE_DEVICES's, else the driver's.
    ``share``: ``needed`` is one pod's ranks; the pods take turns on the GPUs there are."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",")] if visible else []
    ids = ids or [str(i) for i in range(listed_gpus())]
    if len(ids) < needed:
        flags = "--ranks" if share else "--pods x --ranks"
        raise SystemExit(f"{flags} need {needed} GPUs, this machine shows {len(ids)}")
    return ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisUnavailable(Exception):
    """The redis mode cannot run: no server binary, or it did not start."""


@contextmanager
def redis_server(binary: str | None, folder: Path) -> Iterator[str]:
    """A redis-server on a free port that persists nothing; yields its URL, always stops."""
    if not binary or not Path(binary).is_file():
        raise RedisUnavailable(f"no redis-server at {binary or 'PATH'} (--redis-server)")
    folder.mkdir(parents=True)
    port = free_port()
    libs = os.pathsep.join(
        filter(None, [str(Path(binary).parent), os.environ.get("LD_LIBRARY_PATH")])
    )
    options = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with open(folder / "redis.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, *options, "--dir", str(folder)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LD_LIBRARY_PATH": libs},
        )
    try:
        _wait_for_pong(proc, port, folder / "redis.log")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_pong(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RedisUnavailable(f"redis-server exited ({proc.returncode}): {_tail(log, 500)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RedisUnavailable(f"redis-server on port {port} did not answer within 15 s")


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass(frozen=True)
class Fleet:
    """What every pod of a run shares."""

    work: Path
    manifest: Path
    ranks: int
    device: str
    gpus: list[str]
    shared: bool = False  # fewer GPUs than pods x ranks: pods contend, no target applies


def pod_env(fleet: Fleet, folder: Path, index: int, volume: Path, lock_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.removeprefix("TRITON_WARMUP_") not in OWNED}
    env.update(
        TRITON_WARMUP_VOLUME=str(volume),
        TRITON_WARMUP_CREATE_VOLUME="true",
        TRITON_WARMUP_MANIFEST=str(fleet.manifest),
        TRITON_WARMUP_WORK_DIR=str(folder),
        TRITON_WARMUP_DEVICE=fleet.device,
    )
    if lock_url:
        env["TRITON_WARMUP_LOCK_URL"] = lock_url  # the remote tier follows a redis lock URL
    if fleet.device == "cuda":
        first = index * fleet.ranks
        mine = [fleet.gpus[(first + r) % len(fleet.gpus)] for r in range(fleet.ranks)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return env


def run_pods(fleet: Fleet, mode: str, volumes: Sequence[Path], lock_url: str = "") -> list[Pod]:
    """Start one pod per volume together, wait for all; each pod's seconds to its exit."""
    folders = [fleet.work / mode / f"pod-{i}" for i in range(len(volumes))]
    for folder in folders:
        folder.mkdir(parents=True)
    started = time.perf_counter()
    procs = []
    for i, (folder, volume) in enumerate(zip(folders, volumes, strict=True)):
        with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "warmup", "run"],
                    env=pod_env(fleet, folder, i, volume, lock_url),
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group: _kill reaches its ranks
                )
            )
    try:
        ended = _wait_all(procs, started)
    finally:  # no pod outlives the bench (an interrupt, a crash here)
        for p in procs:
            _kill(p)
    return [read_pod(i, f, *ended[i], ranks=fleet.ranks) for i, f in enumerate(folders)]


def _wait_all(
    procs: list[subprocess.Popen[bytes]], started: float
) -> list[tuple[float, int | None]]:
    """Each process's seconds from ``started`` to its exit, and its exit code (None: still
    running at POD_LIMIT_S, killed)."""
    ended: dict[int, tuple[float, int | None]] = {}
    while len(ended) < len(procs):
        now = time.perf_counter() - started
        for i, p in enumerate(procs):
            if i in ended:
                continue
            if p.poll() is not None:
                ended[i] = (now, p.returncode)
            elif now > POD_LIMIT_S:
                _kill(p)
                ended[i] = (now, None)
        time.sleep(0.02)
    return [ended[i] for i in range(len(procs))]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill a pod that still runs, with the rank processes of its group."""
    with contextlib.suppress(ProcessLookupError):  # ranks a crashed launcher left too
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_pod(index: int, folder: Path, seconds: float, code: int | None, *, ranks: int) -> Pod:
    status = RunStatus.read(folder / "status.json")
    pod = Pod(index=index, seconds=round(seconds, 3), code=code, state="no status", tuned=0)
    if status is not None:
        pod.state = status.state
        pod.tuned = sum(s.source == "tuned" for s in status.shapes) / ranks  # rows per rank
        for shape in status.shapes:
            if shape.source == "tuned":
                label = shape.describe()
                pod.tuned_s[label] = max(pod.tuned_s.get(label, 0.0), shape.seconds)
        pod.sources = status.sources
        pod.benchmark_runs = status.benchmark_runs
        pod.remote = status.remote.model_dump() if status.remote else None
        pod.phases = status.phases
        pod.failures = status.failures
    if code != 0 or pod.state != "ready":
        pod.stderr_tail = _tail(folder / "stderr", 3000)
    return pod


def run_mode(name: str, fleet: Fleet, pods: int, redis_binary: str | None) -> Mode:
    root = fleet.work / name
    if name == "solo":
        return Mode(name, run_pods(fleet, name, [root / "volume"]))
    if name == "volume":
        return Mode(name, run_pods(fleet, name, [root / "volume"] * pods))
    volumes = [root / f"volume-{i}" for i in range(pods)]
    try:
        with redis_server(redis_binary, fleet.work / "redis") as url:
            return Mode(name, run_pods(fleet, name, volumes, lock_url=url))
    except RedisUnavailable as e:
        print(f"redis mode skipped: {e}", flush=True)
        return Mode(name, skipped=str(e))


def sharing_floor(solo: Pod, pods: int) -> dict[str, float] | None:
    """How soon N pods that share a fleet's tuning shape by shape can be ready, estimated
    from the solo pod's own run: its time outside tuning, plus the larger of its costliest
    shape's tuning and all its tuning split evenly. No shape is split between pods; if
    each costs a fleet pod what it cost the solo pod, no fleet goes below this. (A
    shape's time includes compiles that later shapes reuse.) None without per-shape
    times."""
    if not solo.tuned_s:
        return None
    tuning = sum(solo.tuned_s.values())
    costliest = max(solo.tuned_s.values())
    fixed = max(solo.seconds - tuning, 0.0)
    floor = fixed + max(costliest, tuning / pods)
    return {
        "fixed_s": round(fixed, 3),
        "costliest_shape_s": round(costliest, 3),
        "tuning_s": round(tuning, 3),
        "floor_s": round(floor, 3),
        "floor_over_solo": round(floor / solo.seconds, 4),
    }


def _num(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def report(
    modes: list[Mode], shapes: int, pods: int, ranks: int, *, bound: float | None
) -> dict[str, Any]:
    """Print the tables; return the checks per mode (``bound``: the target, if any)."""
    solo = next((m for m in modes if m.name == "solo" and m.pods), None)
    solo_s = solo.slowest.seconds if solo and solo.slowest.state == "ready" else None
    checks = {m.name: m.checks(shapes, solo_s, bound) for m in modes}
    floor = sharing_floor(solo.slowest, pods) if solo_s is not None and solo else None
    for m in modes:
        if m.name != "solo" and m.pods and floor is not None:
            checks[m.name]["sharing_floor"] = floor
    print(
        f"\n{shapes} shapes; solo: 1 pod x {ranks} rank(s); fleet: {pods} pods x {ranks}\n\n"
        "| mode | pods | all ready | shapes tuned per pod | time to ready per pod (s) "
        "| slowest / solo | target | tuned once | benchmark runs |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    for m in modes:
        c = checks[m.name]
        if m.skipped:
            print(f"| {m.name} | skipped: {m.skipped} | | | | | | | |")
            continue
        ratio = c["slowest_over_solo"]
        goal = "" if c["target"] is None else f"<= {c['target']}: "
        goal += "" if c["target_met"] is None else "met" if c["target_met"] else "missed"
        print(
            f"| {m.name} | {len(m.pods)} | {'yes' if c['all_ready'] else 'NO'} "
            f"| {', '.join(_num(p.tuned) for p in m.pods)} "
            f"| {', '.join(f'{p.seconds:.2f}' for p in m.pods)} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} | {goal} "
            f"| {'yes' if c['tuned_once'] else 'NO'} ({_num(c['tuned_in_fleet'])}/{shapes}) "
            f"| {c['benchmark_runs']} |"
        )
    if floor is not None:
        print(
            f"\nsharing floor for {pods} pods (from the solo run): {floor['fixed_s']:.2f} s "
            f"outside tuning + max(costliest shape {floor['costliest_shape_s']:.2f} s, "
            f"all tuning {floor['tuning_s']:.2f} s / {pods}) = {floor['floor_s']:.2f} s, "
            f"{floor['floor_over_solo']:.2f}x solo"
            + (f" (target {bound}x)" if bound is not None else "")
        )
    for m in modes:
        for p in m.pods:
            if p.state != "ready" or p.code != 0:
                print(f"\n{m.name} pod {p.index}: {p.state}, exit {p.code}")
                print("\n".join([*p.failures, p.stderr_tail.strip()]))
    for m in modes:
        if m.pods and m.slowest.phases:
            slow = m.slowest
            print(
                f"\n{m.name}: slowest pod {slow.index}, sources {slow.sources}, "
                f"remote {slow.remote}"
            )
            print("\n".join(phase_table(slow.phases, slow.seconds)))
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=1, help="ranks per pod")
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shapes", type=parse_shapes, help="M,N,K;M,N,K (default: cold_start's 8)")
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    parser.add_argument(
        "--share-gpus",
        action="store_true",
        help="a smoke run on fewer GPUs: pods take turns on them, contend, and meet no target",
    )
    bytecode.add_option(parser)
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := set(modes) - set(MODES):
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {','.join(MODES)}")
    modes = [m for m in MODES if m in modes]  # solo first: the others are measured against it
    shapes: list[Shape] = args.shapes or SHAPES
    needed = args.ranks if args.share_gpus else args.pods * args.ranks
    gpus = gpu_ids(needed, share=args.share_gpus) if args.device == "cuda" else []
    shared = args.device == "cuda" and len(gpus) < args.pods * args.ranks
    # the targets are the GPU's: on CPU the pods share the host's cores, a run checks logic
    bound = None if shared or args.device == "cpu" else target(args.pods, args.ranks)
    bytecode.compile_unless(args.no_bytecode)
    work = Path(tempfile.mkdtemp(prefix="fleet-"))
    dtype = "bf16" if args.device == "cuda" else "fp32"
    (work / "manifest.yaml").write_text(manifest_text(shapes, args.ranks, dtype))
    fleet = Fleet(work, work / "manifest.yaml", args.ranks, args.device, gpus, shared)
    try:
        done = []
        for name in modes:
            print(f"{name}: running", flush=True)
            done.append(run_mode(name, fleet, args.pods, args.redis_server))
        checks = report(done, len(shapes), args.pods, args.ranks, bound=bound)
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        result = {
            "pods": args.pods,
            "ranks": args.ranks,
            "device": args.device,
            "shapes": shapes,
            "gpus": gpus,
            "shared_gpus": shared,
            "target": bound,
            "modes": {
                m.name: {"pods": [asdict(p) for p in m.pods], **checks[m.name]} for m in done
            },
        }
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
