"""What a tuned config is valid for: the hardware, the software and the kernel's source.

Imports neither torch nor triton at module level; ``detect()`` imports them lazily.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import json
import platform
import re
import shutil
import subprocess
import textwrap
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from functools import cache, cached_property, lru_cache
from pathlib import Path
from typing import Any

from registry.core import triton_internals
from registry.core.errors import RegistryError, shown


class MatchPolicy(str, Enum):
    """How strictly an entry's fingerprint must equal the current one."""

    EXACT = "exact"  # every field
    SAME_ARCH = "same-arch"  # same compute capability, software and kernel (H100 -> H200)
    ANY = "any"  # only kernel name and shape key; a starting point, not a tuned answer


@dataclass(frozen=True)
class Hardware:
    gpu_name: str
    compute_capability: str  # "9.0", or "cpu"
    sm_count: int
    gpus_per_node: int
    nvlink_full_mesh: bool | None
    memory_gib: int


@dataclass(frozen=True)
class Software:
    torch: str
    triton: str
    triton_hash: str  # triton's source hash where it has one
    cuda_runtime: str
    driver: str
    ptxas: str


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool | None": (bool, type(None)),
}


def _typed(cls: type[Any], data: Any) -> Any:
    """``cls(**data)`` for a flat dataclass of str/int/bool fields, every field present
    and of its declared type (``True`` is no int here), no extra field."""
    name = cls.__name__.lower()
    if not isinstance(data, Mapping):
        raise RegistryError(f"Fingerprint '{name}' is {type(data).__name__}, not an object.")
    declared = {f.name: _FIELD_TYPES[str(f.type)] for f in fields(cls)}
    for key in sorted(set(data) - set(declared), key=str):
        raise RegistryError(f"Fingerprint '{name}' has an unknown field {shown(key)}.")
    for key, types in declared.items():
        if key not in data:
            raise RegistryError(f"Fingerprint '{name}' is missing the field '{key}'.")
        value = data[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            kind = " or ".join(t.__name__ for t in types)
            raise RegistryError(f"Fingerprint '{name}.{key}' has value {shown(value)}; not {kind}.")
    return cls(**data)


@dataclass(frozen=True)
class Fingerprint:
    """Hardware + software + kernel source hash. Equal fingerprints mean a config carries over."""

    hardware: Hardware
    software: Software
    kernel_hash: str = ""

    def with_kernel(self, kernel_hash: str) -> Fingerprint:
        return replace(self, kernel_hash=kernel_hash)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Fingerprint:
        """The fingerprint ``to_json`` wrote; :class:`RegistryError` for any other value,
        a wrong-typed field included (it would break the slugs of every path later)."""
        if not isinstance(data, Mapping):
            raise RegistryError(f"Fingerprint is {type(data).__name__}, not an object.")
        kernel_hash = data.get("kernel_hash", "")
        if not isinstance(kernel_hash, str):
            raise RegistryError(
                f"Fingerprint 'kernel_hash' has value {shown(kernel_hash)}; not a string."
            )
        return cls(
            hardware=_typed(Hardware, data.get("hardware")),
            software=_typed(Software, data.get("software")),
            kernel_hash=kernel_hash,
        )

    def digest(self) -> str:
        """A stable hash of every field; equal digests iff equal fingerprints."""
        return self._digest

    @cached_property
    def _digest(self) -> str:  # lookups ask for it on every call
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def flat(self) -> dict[str, object]:
        """Fields as ``hardware.gpu_name``-style names, for diffs and tables."""
        out: dict[str, object] = {"kernel_hash": self.kernel_hash}
        for part in ("hardware", "software"):
            for f in fields(getattr(self, part)):
                out[f"{part}.{f.name}"] = getattr(getattr(self, part), f.name)
        return out

    def diff(self, other: Fingerprint) -> dict[str, tuple[object, object]]:
        """Fields whose values differ: ``{name: (self's, other's)}``."""
        mine, theirs = self.flat(), other.flat()
        return {k: (v, theirs[k]) for k, v in mine.items() if v != theirs[k]}

    def mismatches(
        self, other: Fingerprint, policy: MatchPolicy
    ) -> dict[str, tuple[object, object]]:
        """The differences that ``policy`` does not forgive; empty means a match."""
        if policy is MatchPolicy.ANY:
            return {}
        differences = self.diff(other)
        if policy is MatchPolicy.EXACT:
            return differences
        forgiven = {f"hardware.{f.name}" for f in fields(Hardware)} - {
            "hardware.compute_capability"
        }
        return {k: v for k, v in differences.items() if k not in forgiven}

    def gpu_slug(self) -> str:
        """Folder name a person can read: GPU, arch, SMs, GPUs per node."""
        hw = self.hardware
        if hw.compute_capability == "cpu":
            return "cpu"
        mesh = "-nvl" if hw.nvlink_full_mesh else ""
        arch = hw.compute_capability.replace(".", "")
        return _slug(f"{hw.gpu_name}_sm{arch}_{hw.sm_count}sm_x{hw.gpus_per_node}{mesh}")

    def software_slug(self) -> str:
        """Folder name: torch, triton and CUDA versions plus a digest of the whole fingerprint."""
        sw = self.software
        return _slug(
            f"torch{sw.torch}_triton{sw.triton}_cuda{sw.cuda_runtime}_{self.digest()[:10]}"
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "unknown"


def cpu_fingerprint(kernel_hash: str = "") -> Fingerprint:
    """The fingerprint of the CPU interpreter platform (tests and the demo)."""
    return Fingerprint(
        hardware=Hardware(
            gpu_name="cpu",
            compute_capability="cpu",
            sm_count=0,
            gpus_per_node=0,
            nvlink_full_mesh=None,
            memory_gib=0,
        ),
        software=_software(cuda=False),
        kernel_hash=kernel_hash,
    )


def detect(kernel_hash: str = "", *, device: int = 0) -> Fingerprint:
    """The fingerprint of this machine: the GPU ``device`` if CUDA is available, else the CPU."""
    import torch  # torch loads on first use

    if not torch.cuda.is_available():
        return cpu_fingerprint(kernel_hash)
    props = torch.cuda.get_device_properties(device)
    hardware = Hardware(
        gpu_name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=int(props.multi_processor_count),
        gpus_per_node=torch.cuda.device_count(),
        nvlink_full_mesh=_nvlink_full_mesh(torch.cuda.device_count()),
        memory_gib=round(props.total_memory / 2**30),
    )
    return Fingerprint(
        hardware, _software(cuda=True, arch=props.major * 10 + props.minor), kernel_hash
    )


def detect_for(device: Any, kernel_hash: str = "") -> Fingerprint:
    """The fingerprint of where kernels run on ``device`` (a ``torch.device``): a CUDA
    device's, or the CPU's (Triton's interpreter) even on a machine with GPUs, so a CPU
    run never stores or reads configs under a GPU's fingerprint. Detected once per GPU:
    a caller while another thread detects waits for its answer."""
    with _DETECTING:
        if getattr(device, "type", device) != "cuda":
            found = _detected_cpu()
        else:
            found = _detected_gpu(getattr(device, "index", None) or 0)
    return found.with_kernel(kernel_hash) if kernel_hash else found


_DETECTING = threading.Lock()


def detect_in_background(device: Any) -> threading.Thread:
    """Start :func:`detect_for` on a thread, for a process that has other waits to
    overlap it with (half a second: Triton hashes its own library); a later
    ``detect_for(device)`` takes its answer. A failure here is left to that call."""

    def detect() -> None:
        with contextlib.suppress(Exception):
            detect_for(device)

    thread = threading.Thread(target=detect, name="fingerprint", daemon=True)
    thread.start()
    return thread


@cache
def _detected_gpu(index: int) -> Fingerprint:
    return detect(device=index)  # once per GPU, whatever the kernels asking


@cache
def _detected_cpu() -> Fingerprint:
    return cpu_fingerprint()


def _software(*, cuda: bool, arch: int = 0) -> Software:
    torch_version, cuda_runtime = _torch_versions()
    triton_version, triton_hash = _triton_versions()
    return Software(
        torch=torch_version,
        triton=triton_version,
        triton_hash=triton_hash,
        cuda_runtime=cuda_runtime if cuda else "none",
        driver=_driver_version() if cuda else "none",
        ptxas=_ptxas_version(arch) if cuda else "none",
    )


def _torch_versions() -> tuple[str, str]:
    try:
        import torch  # torch loads on first use
    except ImportError:
        return "none", "none"
    return str(torch.__version__), str(torch.version.cuda or "none")


def _triton_versions() -> tuple[str, str]:
    try:
        import triton  # triton loads on first use
    except ImportError:
        return "none", "none"
    key = triton_internals.compiler_key()
    return str(triton.__version__), triton_source_hash(key) if key else "unknown"


def triton_source_hash(triton_key: object) -> str:
    """The fingerprint's form of Triton's ``triton_key()``; "" when there is none. Imports
    use it too, so an imported entry matches a detected fingerprint."""
    return hashlib.sha256(str(triton_key).encode()).hexdigest()[:16] if triton_key else ""


NVIDIA_PROC = Path("/proc/driver/nvidia")  # what the NVIDIA kernel module tells


def proc_driver_version(proc: Path = NVIDIA_PROC) -> str | None:
    """The driver version the kernel module states in /proc; None when it does not."""
    try:
        text = (proc / "version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", text)
    return match.group(1) if match else None


def _driver_version() -> str:
    # /proc first: no subprocess on the hot start path.
    found = proc_driver_version()
    if found:
        return found
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown"
    out = _run([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else "unknown"


def _ptxas_version(arch: int) -> str:
    return triton_internals.ptxas_version(arch) or "unknown"


def _nvlink_full_mesh(count: int) -> bool | None:
    """True when every pair of GPUs has an NVLink path (nvidia-smi topo shows NV# for all)."""
    if count < 2:
        return None
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "topo", "-m"]) if smi else ""
    rows = [line.split() for line in out.splitlines() if line.startswith("GPU")]
    if len(rows) < count:
        return None
    cells = [row[1 : count + 1] for row in rows[:count]]
    return all(c == "X" or c.startswith("NV") for row in cells for c in row)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def kernel_source_hash(fn: Callable[..., Any] | Any) -> str:
    """Hash a kernel's source so that moving it to another line, reformatting it or
    editing comments leaves the hash alone, while any change of code changes it.

    Accepts a plain function or a Triton ``JITFunction`` / ``Autotuner`` / ``Heuristics``
    wrapper (anything with ``.fn``), and folds in the hashes of the other JIT
    functions it calls, so an edit in a helper invalidates its callers.
    """
    return _cached_hash(_unwrap(fn))


@lru_cache(maxsize=256)
def _cached_hash(fn: Callable[..., Any]) -> str:
    # Parsing source on every lookup costs milliseconds; a function's source is fixed.
    return _hash_function(fn, seen=set())


def _unwrap(obj: Any) -> Callable[..., Any]:
    while not inspect.isfunction(obj) and hasattr(obj, "fn"):
        obj = obj.fn
    if not inspect.isfunction(obj):
        raise RegistryError(f"Cannot hash the source of {obj!r}: not a function or JIT kernel.")
    return obj  # type: ignore[no-any-return]


def _hash_function(fn: Callable[..., Any], seen: set[int]) -> str:
    seen.add(id(fn))
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise RegistryError(f"Cannot read the source of {fn.__qualname__}: {e}") from None
    tree = ast.parse(source)
    node = tree.body[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.decorator_list = []  # the decorator's arguments are not the kernel's code
    digest = hashlib.sha256(ast.dump(node, include_attributes=False).encode())
    for name in sorted(_called_names(node)):
        callee = getattr(fn, "__globals__", {}).get(name)
        if callee is not None and hasattr(callee, "fn") and id(_unwrap(callee)) not in seen:
            digest.update(f"{name}:{_hash_function(_unwrap(callee), seen)}".encode())
    return digest.hexdigest()


def _called_names(node: ast.AST) -> set[str]:
    return {
        n.func.id
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }


def machine_name() -> str:
    """The host name recorded in entries and lock holders."""
    return platform.node() or "unknown-host"
