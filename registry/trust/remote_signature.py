"""A remote-tier value's signature: an envelope around the bytes a pod publishes.

    value = MAGIC2 + key id (16 ASCII hex digits) + Ed25519 signature (64 bytes)
            + issue time (8 bytes, big-endian ns since the epoch) + payload

The signature covers ``MAGIC2``, the Redis key and hash field the value is stored under,
the issue time, then the payload: a signed value copied under another key does not
verify, and its time cannot be changed. The time orders the values a key held, so a pod
refuses an older value replayed at its own key (:mod:`registry.remote.freshness`).
Values sealed before issue times (``MAGIC``, the same envelope without the time, signed
over key, field and payload) still open, as issued at time 0: never newer than a value
that carries a time. Both magics start with a NUL byte, which no unsigned value (an
entry's JSON, a ``<sha256> <size>`` pointer, an index's JSON) starts with, so values
written before signing read as unsigned; unsigned values carry no time.

Blobs (``triton-warmup:blob:<sha256>``) are not enveloped: they are content-addressed,
and every reader checks their sha256 against a signed pointer or index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from registry.trust.signing import KEY_ID_CHARS, REMOTE, SIGNATURE_BYTES, Signature, Trust

MAGIC = b"\x00tw-sig1"  # before issue times: opens as issued at 0
MAGIC2 = b"\x00tw-sig2"
ISSUED_BYTES = 8
_HEAD = len(MAGIC) + KEY_ID_CHARS + SIGNATURE_BYTES  # both magics are as long
OVERHEAD = _HEAD + ISSUED_BYTES  # what the envelope adds to a value, at most
DOMAIN = REMOTE


@dataclass(frozen=True)
class Opened:
    """A value's payload and its issue time as signed (ns since the epoch; 0 for an old
    envelope or none). ``vouched``: a trusted key's signature verified, so the time can
    be believed (an unsigned value, or one taken from an unknown key where the trust
    allows it, may carry any time)."""

    payload: bytes
    issued: int = 0
    vouched: bool = False


def _signed(key: str, field: str, payload: bytes) -> bytes:
    return key.encode() + b"\0" + field.encode() + b"\0" + payload


def _signed2(key: str, field: str, issued: int, payload: bytes) -> bytes:
    # MAGIC2 first: no old envelope's signed bytes (which start with the key) read as these
    return MAGIC2 + _signed(key, field, issued.to_bytes(ISSUED_BYTES, "big") + payload)


def seal(trust: Trust, key: str, field: str, payload: bytes, *, issued: int | None = None) -> bytes:
    """``payload`` in its envelope, signed by this pod's key with the issue time
    ``issued`` (ns; now by default: a tier gives one above what it has seen,
    ``Freshness.issue``); as it is without a key."""
    when = time.time_ns() if issued is None else issued
    signature = trust.sign(DOMAIN, _signed2(key, field, when, payload))
    if signature is None:
        return payload
    stamp = when.to_bytes(ISSUED_BYTES, "big")
    return MAGIC2 + signature.key_id.encode() + signature.value + stamp + payload


def opened(trust: Trust, key: str, field: str, value: bytes, *, code: bool) -> Opened:
    """``value`` read at ``key`` (and ``field``) opened, if ``trust`` accepts it;
    :class:`registry.trust.signing.Untrusted` naming the key otherwise. ``code``: the
    value carries code, or names the blobs that do (refused unsigned when no key is
    trusted); False for data that runs none (a tuned entry, a host record)."""
    signature, issued, payload = parts(value)
    what = f"remote value {key}" + (f" field {field}" if field else "")
    signed = (
        _signed(key, field, payload)
        if not value.startswith(MAGIC2)
        else _signed2(key, field, issued, payload)
    )
    trust.check(what, DOMAIN, signed, signature, code=code)
    # check verified the signature whenever its key is trusted, or raised
    vouched = _trusted(trust, signature)
    return Opened(payload, issued if vouched else 0, vouched)


def own(trust: Trust, value: bytes) -> Opened:
    """``value``, which this pod sealed itself, opened without a check."""
    signature, issued, payload = parts(value)
    vouched = _trusted(trust, signature)
    return Opened(payload, issued if vouched else 0, vouched)


def _trusted(trust: Trust, signature: Signature | None) -> bool:
    return signature is not None and signature.key_id in trust.keys_for(DOMAIN)


def unseal(trust: Trust, key: str, field: str, value: bytes, *, code: bool) -> bytes:
    """The payload of :func:`opened`."""
    return opened(trust, key, field, value, code=code).payload


def split(value: bytes) -> tuple[Signature | None, bytes]:
    """The signature and the payload of ``value`` (None: it carries none)."""
    signature, _, payload = parts(value)
    return signature, payload


def parts(value: bytes) -> tuple[Signature | None, int, bytes]:
    """The signature, the issue time (0: none) and the payload of ``value``."""
    if value.startswith(MAGIC2) and len(value) >= OVERHEAD:
        stamp = int.from_bytes(value[_HEAD:OVERHEAD], "big")
        return _signature(value), stamp, value[OVERHEAD:]
    if value.startswith(MAGIC) and len(value) >= _HEAD:
        return _signature(value), 0, value[_HEAD:]
    return None, 0, value


def _signature(value: bytes) -> Signature:
    head = len(MAGIC)
    key_id = value[head : head + KEY_ID_CHARS].decode("ascii", errors="replace")
    return Signature(key_id, value[head + KEY_ID_CHARS : _HEAD])
