"""``triton-warmup doctor``: check a host for everything a warmup run needs.

Each check is a small function of the settings and the :class:`Host` that returns one
:class:`Result`; ``run`` prints them as a table (or JSON), with a fix for every miss, and
exits 1 when anything is MISSING. The image runs ``doctor --only compiler`` at build time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from registry.core import triton_internals
from registry.core.errors import RegistryError
from registry.core.fingerprint import NVIDIA_PROC, proc_driver_version
from registry.core.redis_url import redacted
from registry.locks import LockServerUnreachable, check_backend
from registry.locks.file_lease import FileLeaseBackend
from registry.storage.store import Store
from warmup.core.services import Services, unwritable
from warmup.core.settings import Settings
from warmup.run.gpus import listed_gpus

State = Literal["OK", "MISSING", "SKIP"]


@dataclass(frozen=True)
class Result:
    """One row of the report; ``fix`` says what to do when ``state`` is MISSING."""

    name: str
    state: State
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Host:
    """What the checks read from the machine besides the settings; tests give their own."""

    env: Mapping[str, str] = field(default_factory=dict)  # what Triton reads: CC, PATH
    nvidia_proc: Path = NVIDIA_PROC

    @classmethod
    def current(cls) -> Host:
        # Triton reads CC and PATH from this process's environment, so the doctor must too.
        return cls(env=dict(os.environ))


Check = Callable[[Settings, Host], Result]


# ---- GPU and driver -----------------------------------------------------------------------


def check_nvidia_driver(settings: Settings, host: Host) -> Result:
    """NVIDIA GPUs visible to this container, read from /proc (no torch import)."""
    name = "gpu/driver"
    if settings.run.device == "cpu":
        return Result(name, "SKIP", "device is cpu")
    gpus = listed_gpus(host.nvidia_proc / "gpus")
    if gpus:
        driver = proc_driver_version(host.nvidia_proc) or "version unknown"
        return Result(name, "OK", f"{gpus} NVIDIA GPU(s), driver {driver}")
    where = host.nvidia_proc / "gpus"
    if settings.run.device == "auto":
        return Result(name, "SKIP", f"no NVIDIA GPU in {where}: runs will use the CPU interpreter")
    return Result(
        name,
        "MISSING",
        f"device is cuda and {where} lists no GPU",
        "run on a GPU node and request nvidia.com/gpu (NVIDIA device plugin), "
        "or set TRITON_WARMUP_DEVICE=auto or cpu",
    )


def check_torch_cuda(settings: Settings, host: Host) -> Result:
    """torch sees the GPUs that the driver lists (a CPU build of torch does not)."""
    name = "gpu/torch"
    if settings.run.device == "cpu":
        return Result(name, "SKIP", "device is cpu")
    try:
        import torch  # torch loads on first use
    except ImportError:
        return Result(name, "MISSING", "torch is not installed", "use the full image")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return Result(name, "OK", f"torch {torch.__version__} sees {count} CUDA device(s)")
    if settings.run.device == "auto" and not listed_gpus(host.nvidia_proc / "gpus"):
        return Result(name, "SKIP", "torch sees no CUDA device: runs will use the CPU interpreter")
    cuda = torch.version.cuda
    fix = (
        f"torch {torch.__version__} is a CPU build: install a CUDA build of torch"
        if cuda is None
        else f"torch is built for CUDA {cuda}: the driver must support it, and the pod "
        "must request nvidia.com/gpu"
    )
    return Result(name, "MISSING", f"torch {torch.__version__} sees no CUDA device", fix)


# ---- C compiler and Python headers --------------------------------------------------------

_PROBE = "probe_doctor"
# Multi-phase init: loading it leaves nothing in sys.modules or the extension cache.
_PROBE_SOURCE = f"""#include <Python.h>
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{_PROBE}", NULL, 0, NULL}};
PyMODINIT_FUNC PyInit_{_PROBE}(void) {{ return PyModuleDef_Init(&def); }}
"""
_COMPILER_FIX = "install a C compiler and libc headers: apt-get install gcc libc6-dev"


def _headers_fix() -> str:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"install the headers of Python {version}: apt-get install python{version}-dev"


def check_compiler(settings: Settings, host: Host) -> Result:
    """Build and load a C extension the way Triton builds its driver stubs."""
    name = "compiler"
    cc = triton_internals.c_compiler(host.env)
    if cc is None:
        return Result(
            name, "MISSING", "CC is unset and neither gcc nor clang is on PATH", _COMPILER_FIX
        )
    includes = triton_internals.python_includes()
    if not any((Path(d) / "Python.h").is_file() for d in includes):
        return Result(name, "MISSING", f"no Python.h in {', '.join(includes)}", _headers_fix())
    error = _build_probe(cc, includes, host)
    if error is None:
        return Result(name, "OK", f"{cc} builds C extensions against {includes[0]}")
    if "Python.h" in error or "pyconfig.h" in error:
        fix = _headers_fix()
    elif "CC" in host.env:
        fix = f"CC={cc!r} is set: point it at a working C compiler or unset it"
    else:
        fix = _COMPILER_FIX
    return Result(name, "MISSING", f"{cc} cannot build a C extension: {error}", fix)


def _build_probe(cc: str, includes: Sequence[str], host: Host) -> str | None:
    """None when the probe extension compiles and imports; else the first error line."""
    with tempfile.TemporaryDirectory(prefix="triton-warmup-doctor-") as tmp:
        src = Path(tmp) / f"{_PROBE}.c"
        so = Path(tmp) / f"{_PROBE}{sysconfig.get_config_var('EXT_SUFFIX')}"
        src.write_text(_PROBE_SOURCE)
        try:
            done = subprocess.run(
                triton_internals.stub_build_command(cc, src, so, includes),
                env=dict(host.env),
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        if done.returncode != 0:
            return _first_error(done.stderr + done.stdout) or f"exit status {done.returncode}"
        if not so.is_file():
            return f"{cc} exited 0 but wrote no {so.name}"
        return _load(so)


def _first_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")


def _load(so: Path) -> str | None:
    spec = importlib.util.spec_from_file_location(_PROBE, so)
    if spec is None or spec.loader is None:
        return f"{so.name} is not a loadable extension"
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except ImportError as e:
        return f"built but cannot be imported: {e}"
    return None


# ---- folders ------------------------------------------------------------------------------


def check_cache_dir(settings: Settings, host: Host) -> Result:
    """The Triton cache can be created and written."""
    return _folder_result(
        "cache/triton",
        settings.folders.triton_cache_dir,
        "set TRITON_WARMUP_TRITON_CACHE_DIR (or TRITON_WARMUP_WORK_DIR) to a writable folder",
    )


def check_work_dir(settings: Settings, host: Host) -> Result:
    """The pod's scratch folder can be created and written."""
    return _folder_result(
        "cache/work-dir",
        settings.paths.work_dir,
        "set TRITON_WARMUP_WORK_DIR to a writable folder (an emptyDir)",
    )


def check_volume(settings: Settings, host: Host) -> Result:
    """The volume is named, there (a run refuses one that is not, unless asked to make
    it), writable, and its registry readable; its entries counted as ``registry ls``
    counts them (the current generation's, not the store's files)."""
    volume, registry = settings.paths.volume, settings.paths.registry_dir
    if not settings.given("volume"):
        fix = "give --volume (TRITON_WARMUP_VOLUME): the mounted volume's root"
        return Result("volume", "MISSING", "no volume named", fix)
    if not volume.is_dir():
        there = "is not a folder" if volume.exists() else "does not exist"
        if settings.paths.create_volume and not volume.exists():
            error = unwritable(volume)
            if not error:
                return Result("volume", "OK", f"{volume} {there}: run and serve create it")
        fix = (
            "mount the volume there, or point --volume (TRITON_WARMUP_VOLUME) at its mount, "
            "or let run and serve create it with --create-volume "
            "(TRITON_WARMUP_CREATE_VOLUME=true)"
        )
        return Result("volume", "MISSING", f"{volume} {there}", fix)
    error = unwritable(volume)
    if error:
        fix = "mount the volume writable for this user (fsGroup), or set TRITON_WARMUP_VOLUME"
        return Result("volume", "MISSING", f"{volume}: {error}", fix)
    if not registry.exists():
        return Result("volume", "OK", f"{volume} is writable; registry {registry}: not created yet")
    try:
        store = Store(registry)
        entries = len(store.entries())
    except (OSError, RegistryError) as e:
        fix = "make the registry readable for this user, or set TRITON_WARMUP_REGISTRY_DIR"
        return Result("volume", "MISSING", f"registry {registry}: {e}", fix)
    quarantined = f", {store.quarantined} quarantined" if store.quarantined else ""
    detail = f"{volume} is writable; registry {registry}: {entries} entries{quarantined}"
    return Result("volume", "OK", detail)


def _folder_result(name: str, folder: Path, fix: str) -> Result:
    error = unwritable(folder)
    if error:
        return Result(name, "MISSING", f"{folder}: {error}", fix)
    return Result(name, "OK", f"{folder} is writable")


# ---- lock backend -------------------------------------------------------------------------


def check_lock(settings: Settings, host: Host) -> Result:
    """The lock backend answers: redis answers PING, a lease folder is writable."""
    url = settings.locks.url
    try:
        backend = Services(settings).locks_at(url)  # doctor's own check: not the run's
    except RegistryError as e:  # redis-py is not installed
        return Result("lock", "MISSING", str(e), "pip install 'triton-warmup[redis]'")
    except ValueError as e:  # redis-py refuses the URL
        fix = "fix TRITON_WARMUP_LOCK_URL (redis://host:port/db)"
        return Result("lock", "MISSING", f"{redacted(url)}: {e}", fix)
    if isinstance(backend, FileLeaseBackend):
        volume = settings.paths.volume
        on_volume = volume in backend.folder.parents or backend.folder == volume
        if on_volume and not (settings.given("volume") and volume.is_dir()):
            # leases on a volume that is not there: the volume's row says so, with its fix
            return Result("lock", "SKIP", f"file leases in {backend.folder}: no volume there")
        error = unwritable(backend.folder)
        if error:
            fix = "make the lock folder writable, or set TRITON_WARMUP_LOCK_URL"
            return Result("lock", "MISSING", f"{backend.folder}: {error}", fix)
        return Result("lock", "OK", f"file leases in {backend.folder}")
    start = time.monotonic()
    try:
        check_backend(backend)  # a PING, with the lock's own timeouts, no retries
    except LockServerUnreachable as e:
        fix = "start redis there or fix TRITON_WARMUP_LOCK_URL (redis://host:port/db)"
        return Result("lock", "MISSING", str(e), fix)
    ms = (time.monotonic() - start) * 1000
    return Result("lock", "OK", f"{backend.describe()} answered PING in {ms:.0f} ms")


# ---- trust --------------------------------------------------------------------------------


def check_trust(settings: Settings, host: Host) -> Result:
    """The trusted keys and the signing key load, and which artifacts this pod takes:
    signed, code refused (no trusted key) or unsigned allowed (the opt-out)."""
    try:
        trust = Services(settings).trust
    except RegistryError as e:  # a keys folder or a key that cannot be used
        fix = "fix TRITON_WARMUP_TRUSTED_KEYS / TRITON_WARMUP_SIGNING_KEY (docs/trust.md)"
        return Result("trust", "MISSING", str(e), fix)
    signs = f"; signs with key {trust.signer.key_id}" if trust.signer is not None else ""
    return Result("trust", "OK", f"{trust.mode}: {trust.describe()}{signs}")


# ---- the command --------------------------------------------------------------------------

CHECKS: dict[str, tuple[Check, ...]] = {
    "gpu": (check_nvidia_driver, check_torch_cuda),
    "compiler": (check_compiler,),
    "cache": (check_cache_dir, check_work_dir),
    "volume": (check_volume,),
    "lock": (check_lock,),
    "trust": (check_trust,),
}


def diagnose(settings: Settings, host: Host, only: Sequence[str] = ()) -> list[Result]:
    """Every check's result, in the order of :data:`CHECKS`; ``only``: those groups."""
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        raise ValueError(f"doctor: unknown checks {unknown}; known: {sorted(CHECKS)}")
    groups = [g for g in CHECKS if not only or g in only]
    return [check(settings, host) for g in groups for check in CHECKS[g]]


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], settings: Settings
) -> None:
    """Register ``doctor`` on the top-level CLI."""
    doctor = sub.add_parser("doctor", help="check this host for what a warmup run needs")
    doctor.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], help=f"default {settings.run.device}"
    )
    doctor.add_argument(
        "--work-dir",
        type=Path,
        help="checked as cache/work-dir, with the Triton cache under it unless set on its "
        f"own (default {settings.paths.work_dir})",
    )
    doctor.add_argument(
        "--only", action="append", choices=list(CHECKS), help="run only this check (repeatable)"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")


def run(settings: Settings, args: argparse.Namespace, *, host: Host | None = None) -> int:
    """Print the report; 0 when nothing is MISSING, else 1. ``settings`` already hold
    ``--device``, ``--volume`` (an option of every command) and ``--work-dir`` (the CLI
    validates options as settings)."""
    results = diagnose(settings, host or Host.current(), args.only or ())
    ok = all(r.state != "MISSING" for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(r) for r in results]}, indent=2))
    else:
        print(render(results))
    return 0 if ok else 1


def render(results: Sequence[Result]) -> str:
    """A table: check, state, detail; each miss followed by its fix."""
    width = max([len("CHECK"), *(len(r.name) for r in results)])
    lines = [f"{'CHECK':<{width}}  {'STATE':<7}  DETAIL"]
    for r in results:
        lines.append(f"{r.name:<{width}}  {r.state:<7}  {r.detail}")
        if r.state == "MISSING" and r.fix:
            lines.append(f"{'':<{width}}  {'':<7}  fix: {r.fix}")
    counts = {s: sum(r.state == s for r in results) for s in ("OK", "SKIP", "MISSING")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


__all__ = ["CHECKS", "Host", "Result", "add_parser", "diagnose", "render", "run"]
