"""The values of the remote tier (:mod:`registry.remote.tier`): where an entry lives on the
server, the limits on what is read, and the one place each value is read and written.

Layout: one hash per slot, a field per fingerprint, the value an entry file's JSON::

    triton-warmup:entry:<kernel>:<sha256(canonical key)[:24]>
        <fingerprint digest>  ->  {"schema": 1, "kernel": ..., "fingerprint": ..., ...}

A value is read only once its length is known to be within :data:`MAX_VALUE_BYTES` (one
atomic step on the server, ``registry.core.redis_url``). A field's value is read by
:func:`read_field` / :func:`read_fields` and written by :func:`write_field` alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

from registry.core import atomic, redis_url
from registry.core.entry import Entry
from registry.core.errors import RegistryError
from registry.storage.store import MAX_ENTRY_BYTES
from registry.trust import remote_signature

MAX_VALUE_BYTES = MAX_ENTRY_BYTES + remote_signature.OVERHEAD  # an entry in its envelope

PREFIX = "triton-warmup:entry:"
SLOT_BYTES = 8 * 2**20  # a slot's fields read together (policies other than exact)
SLOT_FIELDS = 256  # a slot holds one field per fingerprint: a few


def slot_name(kernel: str, key_json: str) -> str:
    """The hash that holds the entries of ``kernel`` at the canonical key ``key_json``."""
    return f"{PREFIX}{kernel}:{hashlib.sha256(key_json.encode()).hexdigest()[:24]}"


def scan_names(client: Any, pattern: str, limit: int, *, type: str | None = None) -> list[str]:
    """Up to ``limit`` key names matching ``pattern`` (of ``type``), by SCAN: never
    blocks the server as KEYS would."""
    names: list[str] = []
    for name in client.scan_iter(match=pattern, count=1000, _type=type):
        names.append(name.decode(errors="replace") if isinstance(name, bytes) else name)
        if len(names) >= limit:
            break
    return names


def digest(raw: redis_url.Read) -> str:
    """What a fence notes of a field's value: a digest of its bytes, "" for none; a
    value too big to read, by its size (no entry is that big: a publish replaces it)."""
    if isinstance(raw, redis_url.Oversized):
        return f"oversized:{raw.size}"
    return "" if raw is None else hashlib.sha256(raw).hexdigest()[:32]


# ---- the values of the tier: each read and written in one place ------------------------


def read_field(client: Any, name: str, field: str) -> redis_url.Read:
    """The entry's JSON in the field ``field`` of the slot ``name``, unless over
    :data:`MAX_VALUE_BYTES` (then its size); immediate under WATCH."""
    return redis_url.answer(redis_url.hget(client, name, field, MAX_VALUE_BYTES))


def read_fields(client: Any, name: str) -> redis_url.Fields:
    """The fields of the slot ``name`` within :data:`MAX_VALUE_BYTES` each,
    :data:`SLOT_BYTES` and :data:`SLOT_FIELDS` together."""
    reply = redis_url.hgetall(
        client, name, limit=MAX_VALUE_BYTES, budget=SLOT_BYTES, most=SLOT_FIELDS
    )
    return redis_url.fields(reply)


def read_slots(client: Any, names: list[str], budget: int) -> list[redis_url.Fields]:
    """:func:`read_fields` of several slots in one pipeline, each within ``budget``."""
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            redis_url.hgetall(
                pipe, name, limit=min(MAX_VALUE_BYTES, budget), budget=budget, most=SLOT_FIELDS
            )
        return [redis_url.fields(reply) for reply in pipe.execute()]


def write_field(pipe: Any, name: str, field: str, data: bytes) -> None:
    """Store ``data`` (an entry's JSON) in the field ``field`` of the slot ``name``."""
    pipe.hset(name, field, data)


def parse_entry(raw: bytes) -> Entry:
    """The entry in ``raw``: NewerSchema for a newer version's, RegistryError otherwise."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise RegistryError(f"{len(raw)} bytes; limit {MAX_ENTRY_BYTES}")
    try:
        data = atomic.loads(raw)
    except ValueError as e:
        raise RegistryError(f"not JSON: {e}") from None
    return Entry.from_json(data)
