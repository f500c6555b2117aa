"""What a host is known by before torch is imported, and what a warm run learned of it.

The init container must decide in about a second whether a pod has anything to do: on a
full hit it restores the caches and exits, and the server primes on them. Detecting the
real fingerprint (``registry.core.fingerprint.detect``) imports torch and Triton (seconds), so
the decision reads a :class:`Probe` instead: the facts that fix the fingerprint and can be
read from files alone (the installed packages' metadata and file lists, the GPUs and the
driver that the NVIDIA kernel module lists, the Python version, the knobs in the
environment, the kernels' source). A run that detected the real fingerprint on a host with
that probe leaves a :class:`HostRecord` on the volume, under the probe's digest: the
fingerprint, each kernel's source hash, and the key each declared shape was stored at.
Another pod with the same probe (another node, the same image and GPU model) reads it.

The record is a shortcut, never an authority: the server's priming proves every hit
(it compiles what is not there, counted and logged), and a probe that differs in any
fact is a record not found, which runs the full warm.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.core import atomic
from registry.core.errors import RegistryError, named
from registry.core.fingerprint import NVIDIA_PROC, Fingerprint, proc_driver_version
from registry.trust import remote_signature

if TYPE_CHECKING:
    from registry.remote.tier import RemoteTier

log = logging.getLogger(__name__)

VERSION = 1
MAX_RECORD_BYTES = 4 * 2**20  # a record lists keys, not artifacts: 4 MiB is ~40,000 shapes
# Their builds fix the fingerprint's software: each by its distribution names (a Triton
# built by PyTorch's own release is ``pytorch-triton``).
PACKAGES = {"torch": ("torch",), "triton": ("triton", "pytorch-triton")}
KERNELS_PACKAGE = "kernels"  # its sources fix every kernel's source hash
# Knobs read from the environment that enter Triton's or Inductor's keys; folders do not
# (paths never enter a key), nor this project's own settings.
KNOB_PREFIXES = ("TRITON_", "TORCHINDUCTOR_", "TORCH_COMPILE_")
NOT_KNOBS = ("TRITON_WARMUP_", "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR")
NOT_KNOB_SUFFIXES = ("_DIR",)  # a tool's path (TRITON_PTXAS_PATH) is a knob: it picks ptxas
# Where GPUs are MIG instances, the container's list of devices names them "MIG-...":
# a MIG slice has other SMs and memory than the GPU model /proc names.
DEVICE_LISTS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Probe:
    """The facts of a host that fix its fingerprint, read without importing torch."""

    device: str  # "cpu" or "cuda": where the ranks would warm
    gpus: tuple[str, ...] = ()  # the models of the GPUs the driver lists, sorted
    visible_gpus: int = 0
    driver: str = "none"
    python: str = ""
    packages: Mapping[str, str] = field(default_factory=dict)  # name -> version and build
    kernels: str = ""  # digest of the kernels package's sources
    knobs: Mapping[str, str] = field(default_factory=dict)
    mig: bool = False  # the visible GPUs are MIG instances

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = list(self.gpus)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Probe:
        """The probe :meth:`to_json` wrote; :class:`RegistryError` for anything else."""
        try:
            found = cls(**{**data, "gpus": tuple(data.get("gpus", ()))})
        except (TypeError, AttributeError) as e:
            raise RegistryError(f"host probe: not a probe ({e})") from None
        if found.to_json() != data:
            raise RegistryError("host probe: a field of the wrong type")
        return found

    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def differences(self, other: Mapping[str, Any]) -> list[str]:
        """The fields in which a recorded probe (its JSON) differs from this one."""
        mine = self.to_json()
        return sorted(k for k in mine.keys() | other.keys() if mine.get(k) != other.get(k))


def probe(device: str, visible_gpus: int, *, proc: Path = NVIDIA_PROC) -> Probe:
    """This host's :class:`Probe` for ranks on ``device`` (``cpu`` or ``cuda``) with
    ``visible_gpus`` GPUs visible. Files only: no torch, no subprocess."""
    on_gpu = device == "cuda"
    return Probe(
        device=device,
        gpus=tuple(sorted(gpu_models(proc))) if on_gpu else (),
        visible_gpus=visible_gpus if on_gpu else 0,
        driver=(proc_driver_version(proc) or "unknown") if on_gpu else "none",
        python=".".join(map(str, sys.version_info[:3])),
        packages={name: package_build(*names) for name, names in PACKAGES.items()},
        kernels=sources_digest(KERNELS_PACKAGE),
        knobs=knobs(os.environ),
        mig=on_gpu and any("MIG-" in os.environ.get(name, "") for name in DEVICE_LISTS),
    )


def gpu_models(proc: Path = NVIDIA_PROC) -> list[str]:
    """The model name of each GPU the NVIDIA kernel module lists (``Model:`` of each
    ``gpus/<bus>/information``); "" for one whose file cannot be read."""
    try:
        folders = sorted((proc / "gpus").iterdir())
    except OSError:
        return []
    return [_model_of(folder / "information") for folder in folders]


def _model_of(information: Path) -> str:
    try:
        text = atomic.read_bounded(information, 64 * 1024, follow_links=True).decode()
    except (OSError, ValueError, UnicodeDecodeError):
        return ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "Model":
            return value.strip()
    return ""


def package_build(*names: str) -> str:
    """The first installed distribution of ``names``: its name, version and a digest of
    its file list (the RECORD, which hashes every file it installed: two builds of one
    version differ there); "none" when none is installed."""
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        listed = dist.read_text("RECORD") or ""
        return f"{name} {dist.version} {hashlib.sha256(listed.encode()).hexdigest()[:16]}"
    return "none"


def sources_digest(package: str) -> str:
    """A digest of a package's ``.py`` sources (names and bytes), found without importing
    it; "" when it cannot be found."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return ""
    folders = list(spec.submodule_search_locations or []) if spec else []
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.py")):
            with contextlib.suppress(OSError):
                digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
                digest.update(path.read_bytes())
    return digest.hexdigest()[:32] if folders else ""


def knobs(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that may enter Triton's or Inductor's keys."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(KNOB_PREFIXES)
        and not name.startswith(NOT_KNOBS)
        and not name.endswith(NOT_KNOB_SUFFIXES)
    }


def item_id(kernel: str, dtype: str, world: int, shape: Mapping[str, int]) -> str:
    """One declared kernel shape, as the record names it."""
    fields_ = {"kernel": kernel, "dtype": dtype, "world": world, "shape": dict(shape)}
    return json.dumps(fields_, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class HostRecord:
    """What runs on a host of this probe detected and stored: the fingerprint (no kernel
    hash), Triton's key knobs, each kernel's source hash, and the key each declared shape
    (:func:`item_id`) was stored at."""

    probe: Mapping[str, Any]
    fingerprint: Fingerprint
    triton_env: Mapping[str, str] = field(default_factory=dict)
    kernel_hashes: Mapping[str, str] = field(default_factory=dict)
    items: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    ambiguous: bool = False  # hosts of this probe detected different fingerprints

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "ambiguous": self.ambiguous,
            "probe": dict(self.probe),
            "fingerprint": self.fingerprint.to_json(),
            "triton_env": dict(self.triton_env),
            "kernel_hashes": dict(self.kernel_hashes),
            "items": {k: dict(v) for k, v in sorted(self.items.items())},
        }

    @classmethod
    def from_json(cls, data: Any) -> HostRecord:
        """The record :meth:`to_json` wrote; :class:`RegistryError` for anything else."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise RegistryError("host record: not a version 1 record")
        parts: dict[str, dict[str, Any]] = {}
        for name in ("probe", "triton_env", "kernel_hashes", "items"):
            value = data.get(name)
            if not isinstance(value, dict):
                kind = type(value).__name__
                raise RegistryError(f"host record: '{name}' is {kind}, not an object")
            parts[name] = value
        items = parts["items"]
        if not all(isinstance(v, dict) and isinstance(v.get("key"), dict) for v in items.values()):
            raise RegistryError("host record: an item without its key")
        return cls(
            probe=parts["probe"],
            fingerprint=Fingerprint.from_json(data.get("fingerprint")),
            triton_env={str(k): str(v) for k, v in parts["triton_env"].items()},
            kernel_hashes={str(k): str(v) for k, v in parts["kernel_hashes"].items()},
            items=items,
            ambiguous=data.get("ambiguous") is True,
        )

    def merged(self, older: HostRecord | None) -> HostRecord:
        """This record with what ``older`` holds that it does not (items, kernels' hashes).
        Hosts of one probe that detected another fingerprint (a topology, a MIG profile,
        a tool the probe cannot see) make the record ``ambiguous``: no full hit is taken
        from it again, and the full warm runs."""
        if older is None:
            return self
        if older.ambiguous or older.fingerprint != self.fingerprint:
            return replace(self, items={}, ambiguous=True)
        return replace(
            self,
            kernel_hashes={**older.kernel_hashes, **self.kernel_hashes},
            items={**older.items, **self.items},
        )


def record_path(folder: Path, found: Probe) -> Path:
    return folder / f"{found.digest()}.json"


def read_record(folder: Path, found: Probe) -> HostRecord | None:
    """The record of hosts like ``found`` in ``folder``; None when there is none. A record
    that is unreadable, foreign or too big raises :class:`RegistryError`."""
    path = record_path(folder, found)
    try:
        data = atomic.read_bounded(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RegistryError(f"host record {path.name}: {named(e)}") from None
    try:
        record = HostRecord.from_json(atomic.loads(data))
    except (ValueError, RegistryError) as e:
        raise RegistryError(f"host record {path.name}: {e}") from None
    differing = found.differences(record.probe)
    if differing:  # a digest collision, or a hand-edited file
        raise RegistryError(f"host record {path.name}: its probe differs in {differing}")
    return record


def write_record(folder: Path, found: Probe, record: HostRecord) -> Path:
    """Merge ``record`` into the one stored for ``found`` (atomic: a reader sees one or
    the other; two writers at once lose at most the other's new items, which the next
    full run adds again)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        older = read_record(folder, found)
    except RegistryError:
        older = None  # replaced by one that reads
    path = record_path(folder, found)
    atomic.write_json(path, record.merged(older).to_json())
    return path


def keep_record(
    folder: Path, found: Probe, record: HostRecord, remote: RemoteTier | None = None
) -> None:
    """``record`` merged into the volume's (``folder``) and, when there is one, the remote
    tier's record of hosts like ``found``."""
    write_record(folder, found, record)
    if remote is not None:
        publish_record(remote, found, record)


def items_of(
    shapes: Iterable[tuple[str, str, int, Mapping[str, int], Mapping[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """Record items from ``(kernel, dtype, world, manifest shape, stored key)``."""
    return {
        item_id(kernel, dtype, world, shape): {"kernel": kernel, "key": dict(key)}
        for kernel, dtype, world, shape, key in shapes
    }


# ---- on the registry's remote tier: pods on nodes without a shared volume ---------------

REMOTE_PREFIX = "triton-warmup:host:"
REMOTE_TTL_S = 30 * 24 * 3600  # a record no pod has written for a month goes


def remote_key(found: Probe) -> str:
    return f"{REMOTE_PREFIX}{found.digest()}"


def publish_record(tier: RemoteTier, found: Probe, record: HostRecord) -> bool:
    """``record`` merged into the one the remote tier holds under the probe's key (two
    writers at once lose at most the other's new items), kept for :data:`REMOTE_TTL_S`;
    False when the tier did not take it."""
    if not tier.may_publish():
        return False
    payload = atomic.dumps(record.merged(fetch_record(tier, found)).to_json()).encode()
    data = tier.seal(remote_key(found), "", payload)

    def put(client: Any) -> bool:
        return bool(client.set(remote_key(found), data, ex=REMOTE_TTL_S))

    if tier.call(put) is not True:
        return False
    tier.sent(remote_key(found), "", data)
    return True


def fetch_record(tier: RemoteTier, found: Probe) -> HostRecord | None:
    """The record the remote tier holds for hosts like ``found``: its length asked first,
    read only within :data:`MAX_RECORD_BYTES`; None when there is none, the tier does not
    answer, or what it holds is not a record of this probe (logged)."""
    name = remote_key(found)
    size = tier.call(lambda client: int(client.strlen(name)))
    if not size:
        return None
    most = MAX_RECORD_BYTES + remote_signature.OVERHEAD
    if size > most:
        log.warning("host record %s on the remote tier: %d bytes; limit %d", name, size, most)
        return None
    # never more than the bound, even if the value grew since its length was read
    value = tier.call(lambda client: client.getrange(name, 0, most) or b"")
    if value is None:
        return None
    raw = tier.opened(name, "", value, code=False)  # None: refused, one warning naming the key
    try:
        if raw is None:
            return None
        if len(value) > most:
            raise ValueError(f"grown past {most} bytes since its length was read")
        record = HostRecord.from_json(atomic.loads(raw))
        differing = found.differences(record.probe)
        if differing:
            raise ValueError(f"its probe differs in {differing}")
    except (ValueError, RegistryError) as e:
        log.warning("host record %s on the remote tier not used: %s", name, e)
        return None
    return record
