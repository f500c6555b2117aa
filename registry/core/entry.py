"""One stored tuning result: kernel, canonical key, fingerprint, best config, measurements."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

from registry.core.config import KernelConfig, Measurement, is_time
from registry.core.errors import RegistryError, named, shown
from registry.core.fingerprint import Fingerprint, machine_name

SCHEMA_VERSION = 2  # 2: a config may name its algorithm; 1: it cannot
READ_SCHEMAS = (1, 2)
_KERNEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")
_TEXT_FIELDS = {"created": "", "host": "", "source": "tuned"}  # optional, with defaults


def canonical_key(key: Mapping[str, Any]) -> str:
    """The one JSON spelling of a shape key: sorted, compact, scalars and lists only."""
    if not isinstance(key, Mapping):
        raise RegistryError(f"Key {shown(key)} is not a mapping of names to values.")
    _check_key_value("key", key)
    return json.dumps(key, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _check_key_value(path: str, value: Any) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise RegistryError(f"Key field {path}.{shown(k)} is not named by a string.")
            _check_key_value(f"{path}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_key_value(f"{path}[{i}]", v)
    elif isinstance(value, float) and not math.isfinite(value):
        raise RegistryError(f"Key field {path} has value {shown(value)}; not a finite number.")
    elif not isinstance(value, (str, int, float, bool, type(None))):
        raise RegistryError(f"Key field {path} has value {shown(value)}; not JSON.")


def check_kernel_name(kernel: str) -> str:
    if not isinstance(kernel, str) or not _KERNEL_NAME.match(kernel):
        raise RegistryError(
            f"Kernel name {shown(kernel)} is not valid: letters, digits and _.:- only, 1-128 chars."
        )
    return kernel


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class NewerSchema(RegistryError):
    """An entry file a newer version wrote: left alone, neither read nor overwritten."""


@dataclass(frozen=True)
class Entry:
    """A tuned config for one (kernel, key, fingerprint), with the evidence behind it."""

    kernel: str
    key_json: str
    fingerprint: Fingerprint
    best: KernelConfig
    measurements: tuple[Measurement, ...] = ()
    tuning_seconds: float = 0.0
    created: str = field(default_factory=now_iso)
    host: str = field(default_factory=machine_name)
    source: str = "tuned"

    @classmethod
    def make(
        cls,
        kernel: str,
        key: Mapping[str, Any],
        fingerprint: Fingerprint,
        best: KernelConfig,
        **rest: Any,
    ) -> Entry:
        """Build an entry from a plain key mapping, checking the names."""
        return cls(check_kernel_name(kernel), canonical_key(key), fingerprint, best, **rest)

    @property
    def key(self) -> dict[str, Any]:
        return dict(json.loads(self.key_json))

    @property
    def key_digest(self) -> str:
        return hashlib.sha256(f"{self.kernel}\0{self.key_json}".encode()).hexdigest()

    def relpath(self) -> PurePosixPath:
        """Where the entry lives in a store: kernel / GPU / software / shape."""
        fp = self.fingerprint
        shape = f"{shape_slug(self.key)}-{self.key_digest[:12]}.json"
        return PurePosixPath(self.kernel, fp.gpu_slug(), fp.software_slug(), shape)

    def to_json(self) -> dict[str, Any]:
        """In the oldest schema that holds the entry: one whose configs name no algorithm
        is written as schema 1, so a reader of an older version sharing the volume still
        uses it; one that does is schema 2, which such a reader skips."""
        return {
            "schema": SCHEMA_VERSION if self.names_algorithm() else 1,
            "kernel": self.kernel,
            "key": self.key,
            "fingerprint": self.fingerprint.to_json(),
            "best": self.best.to_json(),
            "measurements": [m.to_json() for m in self.measurements],
            "tuning_seconds": self.tuning_seconds,
            "created": self.created,
            "host": self.host,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        """The entry ``to_json`` wrote. Any other JSON value (a wrong-typed field, a list
        for an object, a deep nest) raises :class:`RegistryError` naming the field, and
        nothing else: a reader quarantines it and goes on."""
        if not isinstance(data, Mapping):
            raise RegistryError(f"Entry is {type(data).__name__}, not a JSON object.")
        schema = _read_schema(data.get("schema"))
        for name in ("kernel", "key", "fingerprint", "best"):
            if name not in data:
                raise RegistryError(f"Entry is missing the field '{name}'.")
        measurements, seconds, text = _optional_fields(data)
        try:
            entry = cls.make(
                data["kernel"],
                data["key"],
                Fingerprint.from_json(data["fingerprint"]),
                KernelConfig.from_json(data["best"]),
                measurements=tuple(Measurement.from_json(m) for m in measurements),
                tuning_seconds=seconds,
                **text,
            )
        except RecursionError:
            raise RegistryError("Entry is nested too deeply.") from None
        except (OverflowError, ValueError, TypeError, AttributeError, KeyError) as e:
            # a value no check above foresaw (a 400-digit time): one entry, never the store
            raise RegistryError(f"Entry does not parse: {named(e)}") from None
        if schema == 1 and entry.names_algorithm():  # no version wrote that: a forged file
            raise RegistryError("Entry has schema 1 but names an algorithm; schema 2 can.")
        return entry

    def names_algorithm(self) -> bool:
        """Whether any config of the entry names an algorithm (schema 2 holds it)."""
        configs = (self.best, *(m.config for m in self.measurements))
        return any(c.algorithm is not None for c in configs)

    def identity(self) -> tuple[str, ...]:
        """Every field but the measurements; the smallest (the earliest tuning) wins a merge."""
        best = json.dumps(self.best.to_json(), sort_keys=True)
        return (self.created, self.host, best, repr(self.tuning_seconds), self.source)

    def merge(self, other: Entry) -> Entry:
        """Combine two entries of one slot. Idempotent, commutative and associative, so a
        duplicate tuning or a replayed write is harmless: the earliest tuning wins and the
        measurements of both are kept (for a config both measured, the faster record)."""
        if (self.relpath(), self.key_json) != (other.relpath(), other.key_json):
            raise RegistryError(
                f"Cannot merge entries of different slots: {self.relpath()} and {other.relpath()}."
            )
        winner = self if self.identity() <= other.identity() else other
        by_config: dict[KernelConfig, Measurement] = {}
        for m in (*self.measurements, *other.measurements):
            held = by_config.get(m.config)
            by_config[m.config] = m if held is None else min(held, m, key=_measurement_order)
        return replace(winner, measurements=sort_measurements(list(by_config.values())))


def _read_schema(schema: Any) -> int:
    """An entry's ``schema`` if this version reads it; one a later version wrote raises
    :class:`NewerSchema`, anything else :class:`RegistryError`."""
    if schema not in READ_SCHEMAS or isinstance(schema, bool):
        newer = type(schema) is int and schema > max(READ_SCHEMAS)  # a later version's
        raise (NewerSchema if newer else RegistryError)(
            f"Entry 'schema' has value {shown(schema)}; "
            f"this version reads schemas {', '.join(map(str, READ_SCHEMAS))}."
        )
    return int(schema)


def _optional_fields(data: Mapping[str, Any]) -> tuple[list[Any], float, dict[str, str]]:
    """The fields an entry may leave out, each checked, defaults filled in: its
    measurements (as JSON still), its tuning seconds and its text fields."""
    measurements = data.get("measurements", [])
    if not isinstance(measurements, list):
        raise RegistryError(f"Entry 'measurements' has value {shown(measurements)}; not a list.")
    seconds = data.get("tuning_seconds", 0.0)
    if not is_time(seconds):
        raise RegistryError(f"Entry 'tuning_seconds' has value {shown(seconds)}; not >= 0.")
    text = {name: data.get(name, default) for name, default in _TEXT_FIELDS.items()}
    for name, value in text.items():
        if not isinstance(value, str):
            raise RegistryError(f"Entry '{name}' has value {shown(value)}; not a string.")
    return measurements, float(seconds), text


def _measurement_order(m: Measurement) -> tuple[object, ...]:
    """A total order on measurements of one config: successes first, then faster."""
    return (not m.ok, m.median_ms, m.p20_ms, m.p80_ms, m.error or "")


def sort_measurements(
    measurements: list[Measurement] | tuple[Measurement, ...],
) -> tuple[Measurement, ...]:
    """Fastest first, failures last, ties broken by the config's JSON: one stable order."""

    def order(m: Measurement) -> tuple[float, str]:
        median = m.median_ms if m.ok else math.inf
        return (median, json.dumps(m.config.to_json(), sort_keys=True))

    return tuple(sorted(measurements, key=order))


def shape_slug(key: Mapping[str, Any]) -> str:
    """``M4096_N6656_K16384_dtype-bf16`` style: readable, filesystem-safe, bounded."""
    parts = []
    for name, value in sorted(key.items()):
        text = "-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        parts.append(f"{name}{text}" if len(name) <= 2 else f"{name}-{text}")
    slug = re.sub(r"[^A-Za-z0-9._+-]+", "-", "_".join(parts)).strip("-_")
    return slug[:80] or "key"
