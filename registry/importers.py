"""Import tuning results users already have.

- Triton's own ``<fn>.autotune.json`` (``cache_results=True`` / ``TRITON_CACHE_AUTOTUNING=1``):
  ``{"key": [...], "configs_timings": [[config.__dict__, [p50, p20, p80]], ...]}``.
- Triton-distributed's ``~/.triton_dist/autotune/<fn>/<hash>.json``:
  ``{"config": [[ms, {param: value | {"__triton_config__": {...}}}], ...], "key": ...,
  "func": ..., "deps": {...}, "timestamp": ...}``.

Neither file says what hardware it was tuned on, so the caller names the fingerprint.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from registry.config import KernelConfig, Measurement, Scalar
from registry.entry import Entry, sort_measurements
from registry.errors import RegistryError
from registry.fingerprint import Fingerprint, triton_source_hash


@dataclass
class ImportResult:
    entries: list[Entry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "path: reason" per file skipped


def import_triton_autotune(root: Path, fingerprint: Fingerprint) -> ImportResult:
    """Every ``*.autotune.json`` under ``root`` (a TRITON_CACHE_DIR) as entries."""
    return _import_files(sorted(root.rglob("*.autotune.json")), fingerprint, _from_triton)


def import_triton_autotune_files(paths: Iterable[Path], fingerprint: Fingerprint) -> ImportResult:
    """The ``*.autotune.json`` files ``paths`` as entries."""
    return _import_files(paths, fingerprint, _from_triton)


def import_triton_dist(root: Path, fingerprint: Fingerprint) -> ImportResult:
    """Every ``<fn>/<hash>.json`` under ``root`` (``~/.triton_dist/autotune``) as entries."""
    return _import_files(sorted(root.glob("*/*.json")), fingerprint, _from_triton_dist)


def _import_files(paths: Iterable[Path], fingerprint: Fingerprint, parse: Any) -> ImportResult:
    result = ImportResult()
    for path in paths:
        try:
            data = json.loads(path.read_text())
            result.entries.append(parse(path, data, fingerprint))
        except (OSError, ValueError, RegistryError, KeyError, TypeError) as e:
            result.errors.append(f"{path}: {e}")
    return result


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
