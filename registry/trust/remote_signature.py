"""A remote-tier value's signature: an envelope around the bytes a pod publishes.

    value = MAGIC + key id (16 ASCII hex digits) + Ed25519 signature (64 bytes) + payload

The signature covers the Redis key and hash field the value is stored under, then the
payload: a signed value copied under another key does not verify. ``MAGIC`` starts with
a NUL byte, which no unsigned value (an entry's JSON, a ``<sha256> <size>`` pointer, an
index's JSON) starts with, so values written before signing read as unsigned.

Blobs (``triton-warmup:blob:<sha256>``) are not enveloped: they are content-addressed,
and every reader checks their sha256 against a signed pointer or index.
"""

from __future__ import annotations

from registry.trust.signing import KEY_ID_CHARS, REMOTE, SIGNATURE_BYTES, Signature, Trust

MAGIC = b"\x00tw-sig1"
OVERHEAD = len(MAGIC) + KEY_ID_CHARS + SIGNATURE_BYTES  # what the envelope adds to a value
DOMAIN = REMOTE


def _signed(key: str, field: str, payload: bytes) -> bytes:
    return key.encode() + b"\0" + field.encode() + b"\0" + payload


def seal(trust: Trust, key: str, field: str, payload: bytes) -> bytes:
    """``payload`` in its envelope, signed by this pod's key; as it is without a key."""
    signature = trust.sign(DOMAIN, _signed(key, field, payload))
    if signature is None:
        return payload
    return MAGIC + signature.key_id.encode() + signature.value + payload


def unseal(trust: Trust, key: str, field: str, value: bytes, *, code: bool) -> bytes:
    """The payload of ``value`` read at ``key`` (and ``field``), if ``trust`` accepts it;
    :class:`registry.trust.signing.Untrusted` naming the key otherwise. ``code``: the
    value carries code, or names the blobs that do (refused unsigned when no key is
    trusted); False for data that runs none (a tuned entry, a host record)."""
    signature, payload = split(value)
    what = f"remote value {key}" + (f" field {field}" if field else "")
    trust.check(what, DOMAIN, _signed(key, field, payload), signature, code=code)
    return payload


def split(value: bytes) -> tuple[Signature | None, bytes]:
    """The signature and the payload of ``value`` (None: it carries none)."""
    if not value.startswith(MAGIC) or len(value) < OVERHEAD:
        return None, value
    head = len(MAGIC)
    key_id = value[head : head + KEY_ID_CHARS].decode("ascii", errors="replace")
    signature = value[head + KEY_ID_CHARS : OVERHEAD]
    return Signature(key_id, signature), value[OVERHEAD:]
