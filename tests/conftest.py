"""Shared fixtures: fingerprints and entries built the way production code builds them."""

from __future__ import annotations

import contextlib
import datetime
import getpass
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from registry import Entry, Fingerprint, Hardware, KernelConfig, Measurement, Software

if TYPE_CHECKING:
    from warmup.core.settings import Settings

_counter = itertools.count()
CREATED_BASE = datetime.datetime(2026, 11, 21, 10, 0, 0, tzinfo=datetime.timezone.utc)
ROOT = Path(__file__).parents[1]
DEMO = ROOT / "tests" / "kernels_demo.yaml"  # examples/demo.yaml without its compiled model


_SESSION_TMP: list[Path] = []  # this process's temp folder, removed at its end


def pytest_configure(config: pytest.Config) -> None:
    # Kernels run on CPU tensors through Triton's interpreter, which Triton reads when a
    # kernel module is imported; subprocesses that compile for a GPU target drop it.
    os.environ["TRITON_INTERPRET"] = "1"
    _use_session_temp_folder()


def _use_session_temp_folder() -> None:
    """Whatever the tests and their subprocesses write to the temp folder goes to one
    folder of this session's, removed at its end: Inductor writes its default cache
    (``torchinductor_<user>``: compiled ``.so`` files) and its precompiled C++ headers
    (whatever TORCHINDUCTOR_CACHE_DIR says) in ``tempfile.gettempdir()``. pytest's own
    folders stay where they were, kept after a failure (PYTEST_DEBUG_TEMPROOT)."""
    system = tempfile.gettempdir()
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system)
    folder = Path(tempfile.mkdtemp(prefix=f"triton-warmup-tests-{getpass.getuser()}-"))
    _SESSION_TMP.append(folder)
    os.environ["TMPDIR"] = str(folder)  # subprocesses, and (tempdir reset) this one
    tempfile.tempdir = None


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _SESSION_TMP:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (``make test`` runs two workers), the tests of a module that share a
    module-scoped fixture (a run, a compiled model, a redis-server) go to one worker
    (``--dist loadgroup``), so that the fixture is made once, not once per worker."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope == "module" for fixturedefs in defs for d in fixturedefs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A green run leaves nothing in the temp folder: pytest removes the run's folder
    (``tmp_path_retention_policy = "failed"``); this removes its ``-current`` link and
    the per-user folder once no older run is left."""
    if exitstatus != 0 or session.config.option.basetemp:
        return
    system = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()
    root = Path(system) / f"pytest-of-{getpass.getuser()}"
    for current in root.glob("*current"):
        if current.is_symlink() and not current.exists():
            current.unlink()
    with contextlib.suppress(OSError):
        root.rmdir()


def settings_for(root: Path, **extra: Any) -> Settings:
    """Settings of a CPU run whose volume and work folder live under ``root``."""
    from warmup.core.settings import Settings

    defaults = {"volume": root / "volume", "work_dir": root / "work", "device": "cpu"}
    return Settings(**{**defaults, "manifest": DEMO, **extra})


def write_manifest(path: Path, text: str) -> Path:
    from warmup.core.manifest import parse_manifest

    parse_manifest(text)  # keep test manifests valid
    path.write_text(text)
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every default folder of the CLI inside tmp_path (the working folder too)."""
    monkeypatch.chdir(tmp_path)
    for name in ("VOLUME", "WORK_DIR"):
        monkeypatch.setenv(f"TRITON_WARMUP_{name}", str(tmp_path / name.lower()))
    return tmp_path


def error_line(err: str) -> str:
    """The one line a CLI error is."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("triton-warmup: error: "), err
    return lines[0]


def free_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether ``predicate`` came true within ``timeout`` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def env_without_interpreter(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "TRITON_DEFAULT_FP_FUSION": "1", **extra}


def run_python(
    *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd`` with exactly ``env``; its output captured."""
    argv = [sys.executable, *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_program(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m warmup ARGS``, the ``triton-warmup`` program, with ``env`` on top of
    an environment without the interpreter switch; its output captured."""
    return run_python("-m", "warmup", *args, env={**env_without_interpreter(), **env}, timeout=240)


def run_processes(
    commands: list[tuple[list[str], dict[str, str]]], *, timeout: float, killed_ok: bool = False
) -> list[str]:
    """Every (argv, env) at once in ROOT; each one's stdout, in order, once all exited 0.
    ``killed_ok``: one killed with SIGKILL (on purpose) is left out."""
    procs = [
        subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv, env in commands
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            if killed_ok and proc.returncode == -9:
                continue
            assert proc.returncode == 0, err[-3000:]
            outputs.append(out)
    finally:  # a process that hangs (a deadlock is a failure too) leaves nothing running
        for proc in procs:
            proc.kill()
            proc.communicate()
    return outputs


def last_json(out: str) -> Any:
    """The JSON line a process printed last."""
    return json.loads(out.strip().splitlines()[-1])


def run_rank_processes(
    module: str, world: int, *args: str, timeout: float = 600
) -> list[dict[str, Any]]:
    """``python -m module WORLD RANK *args`` once per rank, on CPU under the interpreter;
    each prints one JSON line last, returned in rank order."""
    env = env_without_interpreter(TRITON_INTERPRET="1")
    argv = [sys.executable, "-m", module, str(world)]
    ranks = [([*argv, str(rank), *args], env) for rank in range(world)]
    return [last_json(out) for out in run_processes(ranks, timeout=timeout)]


def gpu_fingerprint(
    name: str = "NVIDIA H200", cc: str = "9.0", sms: int = 132, **software: str
) -> Fingerprint:
    sw = Software(
        torch="2.11.0",
        triton="3.6.0",
        triton_hash="t" * 16,
        cuda_runtime="12.8",
        driver="570.86",
        ptxas="12.8",
    )
    return Fingerprint(
        Hardware(
            gpu_name=name,
            compute_capability=cc,
            sm_count=sms,
            gpus_per_node=8,
            nvlink_full_mesh=True,
            memory_gib=141,
        ),
        replace(sw, **software),
        kernel_hash="k" * 64,
    )


@pytest.fixture
def h200() -> Fingerprint:
    return gpu_fingerprint()


@pytest.fixture(autouse=True)
def _lock_servers_never_seen(monkeypatch):
    """Every test starts with no lock server known to be silent or logged as down (the
    locks module keeps both per process, by server: a port reused by a later test)."""
    from registry import locks

    monkeypatch.setattr(locks, "_OUTAGE_LOGGED", {})
    monkeypatch.setattr(locks, "_SILENT_SINCE", {})


@pytest.fixture(scope="session")
def make_entry() -> Callable[..., Entry]:
    def make(
        m: int = 4096,
        *,
        kernel: str = "ag_gemm",
        fp: Fingerprint | None = None,
        block_m: int = 128,
        median: float = 1.0,
        **rest: Any,
    ) -> Entry:
        best = KernelConfig.make({"BLOCK_M": block_m, "BLOCK_N": 128}, num_warps=8)
        other = KernelConfig.make({"BLOCK_M": block_m // 2, "BLOCK_N": 128}, num_warps=4)
        measurements = (
            Measurement(best, median, median * 0.9, median * 1.1),
            Measurement(other, median * 2, median * 1.9, median * 2.1),
            Measurement(KernelConfig.make({"BLOCK_M": 512}), error="out of shared memory"),
        )
        key = {"M": m, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}
        # each entry made later than the one before (never wrapping), all after 10:00:00
        later = CREATED_BASE + datetime.timedelta(seconds=1 + next(_counter))
        rest.setdefault("created", later.isoformat())
        return Entry.make(
            kernel,
            key,
            fp or gpu_fingerprint(),
            best,
            measurements=measurements,
            tuning_seconds=3.5,
            **rest,
        )

    return make


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server of the test module's own, on a unix socket: its URL."""
    from registry.locks import backend_from_url

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (make test installs it where apt-get works)")
    folder = tmp_path_factory.mktemp("redis")
    sock = folder / "redis.sock"
    proc = subprocess.Popen(
        [
            server,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"unix://{sock}"
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            if backend_from_url(url).client.ping():
                break
        except Exception:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield url
    proc.terminate()
    proc.wait()


@pytest.fixture(autouse=True, scope="session")
def _models_served_compiled():
    """The suite serves declared models through torch.compile unless a test asks for
    their packages (``TRITON_WARMUP_MODELS_SERVE``; ``models_serve=`` in settings): a
    package compiles C++ for 10 to 30 s on a 2-core machine. Set in the environment for
    the whole session (module fixtures included), so rank and server processes inherit it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_WARMUP_MODELS_SERVE", "compiled")
        yield
