"""Import tuning results users already have.

- Triton's own ``<fn>.autotune.json`` (``cache_results=True`` / ``TRITON_CACHE_AUTOTUNING=1``):
  ``{"key": [...], "configs_timings": [[config.__dict__, [p50, p20, p80]], ...]}``.
- Triton-distributed's ``~/.triton_dist/autotune/<fn>/<hash>.json``:
  ``{"config": [[ms, {param: value | {"__triton_config__": {...}}}], ...], "key": ...,
  "func": ..., "deps": {...}, "timestamp": ...}``.

Neither file says what hardware it was tuned on, so the caller names the fingerprint.

Nothing read is trusted: each file is bounded (bytes, then JSON values, then depth)
before it is parsed, what the store would quarantine (an entry over its
:data:`~registry.storage.store.MAX_ENTRY_BYTES`) is refused here, and a bad file is skipped with
its reason while the others import. No link is followed, to a file or to a folder: an
import reads what lies in its folder and nothing else.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from registry.core import atomic
from registry.core.config import KernelConfig, Measurement, Scalar
from registry.core.entry import Entry, sort_measurements
from registry.core.errors import RegistryError
from registry.core.fingerprint import Fingerprint, triton_source_hash
from registry.storage.store import MAX_ENTRY_BYTES

MAX_FILE_BYTES = 8 * 2**20  # a file of Triton's: ~250 bytes a config, the entry ~1/3 of it
MAX_FILE_VALUES = 2**17  # JSON values of one file, counted before parsing: ~12 a config
MAX_TOTAL_BYTES = 16 * 2**20  # the entries of one import together, as the store writes them
Parse = Callable[[Path, Any, Fingerprint], Entry]


@dataclass
class ImportResult:
    entries: list[Entry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "path: reason" per file skipped
    files: int = 0  # files imported (one entry each)


def import_triton_autotune(root: Path, fingerprint: Fingerprint) -> ImportResult:
    """Every ``*.autotune.json`` under ``root`` (a TRITON_CACHE_DIR) as entries."""
    found = _walk(root, lambda depth, name: name.endswith(".autotune.json"))
    return _import_files(found, fingerprint, _from_triton)


def import_triton_autotune_files(paths: Iterable[Path], fingerprint: Fingerprint) -> ImportResult:
    """The ``*.autotune.json`` files ``paths`` as entries (a link among them is skipped)."""
    return _import_files((_Found(p) for p in paths), fingerprint, _from_triton)


def import_triton_dist(root: Path, fingerprint: Fingerprint) -> ImportResult:
    """Every ``<fn>/<hash>.json`` under ``root`` (``~/.triton_dist/autotune``) as entries."""
    found = _walk(root, lambda depth, name: depth == 1 and name.endswith(".json"), depth=1)
    return _import_files(found, fingerprint, _from_triton_dist)


@dataclass(frozen=True)
class _Found:
    path: Path
    dir_fd: int | None = None  # the open folder ``path`` is a name in, read at it
    refused: str = ""  # why it is skipped unread


def _walk(
    root: Path, wanted: Callable[[int, str], bool], depth: int | None = None
) -> Iterator[_Found]:
    """Each file under ``root`` that ``wanted(level, name)`` takes, in order, at most
    ``depth`` folders down, to be read at its open folder (one swapped for a link
    meanwhile leads nowhere). A link to a folder is never followed: it is found refused.
    ``root`` itself may be a link (the user named it); a missing one holds nothing."""
    if not root.is_dir():
        return
    if root.is_symlink():
        root = root.resolve()
    for folder, dirs, names, fd in os.fwalk(root):  # never descends through a link
        here = Path(folder)
        level = len(here.relative_to(root).parts)
        deeper = depth is None or level < depth
        links = {d for d in dirs if stat.S_ISLNK(os.lstat(d, dir_fd=fd).st_mode)}
        dirs[:] = sorted(set(dirs) - links) if deeper else []
        for name in sorted(links) if deeper else []:
            yield _Found(here / name, refused="a link to a folder, not followed")
        for name in sorted(names):
            if wanted(level, name):
                yield _Found(here / name, fd)


def _import_files(found: Iterable[_Found], fingerprint: Fingerprint, parse: Parse) -> ImportResult:
    """Each file as an entry, or its line in ``errors``; the entries together at most
    :data:`MAX_TOTAL_BYTES` as stored (the files past it are skipped: import them apart)."""
    result = ImportResult()
    total = 0
    for each in found:
        try:
            if each.refused:
                raise RegistryError(each.refused)
            entry, size = _import_file(each, fingerprint, parse)
            if total + size > MAX_TOTAL_BYTES:
                raise RegistryError(
                    f"the entries so far and this one come to {total + size} bytes; limit "
                    f"{MAX_TOTAL_BYTES} an import (import the rest apart)"
                )
        except (OSError, ValueError, RegistryError, LookupError, TypeError, AttributeError) as e:
            result.errors.append(f"{each.path}: {_reason(e)}")
            continue
        except RecursionError:  # a nest the parser took but the entry's code does not
            result.errors.append(f"{each.path}: nested too deeply")
            continue
        total += size
        result.entries.append(entry)
        result.files += 1
    return result


def _import_file(found: _Found, fingerprint: Fingerprint, parse: Parse) -> tuple[Entry, int]:
    """The entry in one file and its size as the store writes it: the file bounded in
    bytes and in JSON values before it is parsed, its depth by the parser, and the entry
    refused where the store would quarantine it."""
    path = found.path
    name = Path(path.name) if found.dir_fd is not None else path
    raw = atomic.read_bounded(name, MAX_FILE_BYTES, dir_fd=found.dir_fd)
    values = atomic.json_values(raw)
    if values > MAX_FILE_VALUES:
        raise RegistryError(f"{values} JSON values; limit {MAX_FILE_VALUES}")
    try:
        data = json.loads(raw)  # Triton writes a failed config's time as Infinity
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    entry = parse(path, data, fingerprint)
    stored = atomic.dumps(entry.to_json()).encode()
    if len(stored) > MAX_ENTRY_BYTES:
        raise RegistryError(
            f"its entry ({len(entry.measurements)} configs) would be {len(stored)} bytes; "
            f"the store's limit is {MAX_ENTRY_BYTES} (it would quarantine it)"
        )
    Entry.from_json(atomic.loads(stored))  # what the store's reader does with it
    return entry, len(stored)


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno == errno.ELOOP:
        return "a link, not followed"
    if isinstance(e, OSError):
        return e.strerror or str(e)
    if isinstance(e, KeyError):
        return f"no {e} field"
    return str(e)


def _from_triton(path: Path, data: Mapping[str, Any], fingerprint: Fingerprint) -> Entry:
    kernel = path.name.removesuffix(".autotune.json")
    measurements = []
    for config, timings in data["configs_timings"]:
        values = list(timings) if isinstance(timings, (list, tuple)) else [timings] * 3
        measurements.append(_measurement(KernelConfig.from_json(config), values))
    return _entry(
        kernel, {"triton_key": data["key"]}, fingerprint, measurements, path, "triton-autotune"
    )


def _from_triton_dist(path: Path, data: Mapping[str, Any], fingerprint: Fingerprint) -> Entry:
    kernel = str(data.get("func") or path.parent.name)
    measurements = [_measurement(_flatten_dist_config(cfg), [ms] * 3) for ms, cfg in data["config"]]
    deps = data.get("deps") or {}
    if deps:
        fingerprint = replace(
            fingerprint,
            software=replace(
                fingerprint.software,
                torch=str(deps.get("torch.version", fingerprint.software.torch)),
                triton=str(deps.get("triton.version", fingerprint.software.triton)),
                triton_hash=triton_source_hash(deps.get("triton.hash"))
                or fingerprint.software.triton_hash,
            ),
        )
    return _entry(
        kernel,
        {"triton_dist_key": _plain(data.get("key"))},
        fingerprint,
        measurements,
        path,
        "triton-dist",
    )


def _flatten_dist_config(cfg: Mapping[str, Any]) -> KernelConfig:
    """``{"gemm_config": <triton.Config>, "extra": 3}`` -> one config: the Triton config's
    launch options, its kwargs and the other scalar parameters together."""
    kwargs: dict[str, Scalar] = {}
    launch: dict[str, Any] = {}
    for name, value in cfg.items():
        if isinstance(value, Mapping) and "__triton_config__" in value:
            inner = KernelConfig.from_json(value["__triton_config__"])
            kwargs.update(inner.meta)
            launch = {
                "num_warps": inner.num_warps,
                "num_stages": inner.num_stages,
                "num_ctas": inner.num_ctas,
                "maxnreg": inner.maxnreg,
            }
        elif isinstance(value, (int, float, str, bool, type(None))):
            kwargs[name] = value
        else:
            raise RegistryError(f"config parameter '{name}' has value {value!r}; not importable.")
    return KernelConfig.make(kwargs, **launch)


def _measurement(config: KernelConfig, timings: list[Any]) -> Measurement:
    values = [float(t) if isinstance(t, (int, float)) else math.inf for t in timings[:3]]
    values += [values[0]] * (3 - len(values))
    if not all(math.isfinite(v) for v in values):
        return Measurement(config, error="failed in the original tuner (time inf)")
    median, p20, p80 = values[:3]
    return Measurement(config, median, p20, p80)


def _entry(
    kernel: str,
    key: dict[str, Any],
    fingerprint: Fingerprint,
    measurements: list[Measurement],
    path: Path,
    source: str,
) -> Entry:
    ordered = sort_measurements(measurements)
    if not ordered or not ordered[0].ok:
        raise RegistryError("no config with a finite time")
    created = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    return Entry.make(
        kernel,
        key,
        fingerprint,
        ordered[0].config,
        measurements=ordered,
        created=created.isoformat(timespec="seconds"),
        source=source,
    )


def _plain(value: Any) -> Any:
    """Triton-distributed's JSON key with its tagged dtypes turned into plain strings."""
    if isinstance(value, Mapping):
        if "__torch_dtype__" in value:
            return str(value["__torch_dtype__"])
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
