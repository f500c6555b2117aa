"""A bundle's signature: a ``SIGNATURE.json`` member before ``MANIFEST.json``.

The signature covers the bytes of MANIFEST.json, which lists the sha256 and size of
every other member, and a bundle's reader refuses any member that is not listed or
differs from its listing: so one signature vouches for every byte installed. The
reader checks it right after reading MANIFEST.json, before it parses it and before any
other member is read (:class:`registry.trust.signing.Trust`).

Signing an existing bundle writes the signature as a gzip member of its own and then
the original file unchanged (gzip streams concatenate; so do the tar streams inside):
signing 300 MB costs one read to verify it and one copy, never a recompression.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import shutil
import tarfile
import time
from pathlib import Path

from registry.bundles import tar_stream
from registry.core import atomic
from registry.core.errors import BundleRejected, why
from registry.trust.signing import (
    ALGORITHM,
    BUNDLE,
    KEY_ID_CHARS,
    SIGNATURE_BYTES,
    Signature,
    SigningKey,
)

SIGNATURE = "SIGNATURE.json"
FORMAT = "triton-warmup-signature"
DOMAIN = BUNDLE  # what the signed message starts with: never valid for another use
MAX_BYTES = 4096
MAX_HEADER_BYTES = 8 * 2**10


def encode(signature: Signature) -> bytes:
    """SIGNATURE.json's bytes."""
    return atomic.dumps(
        {
            "format": FORMAT,
            "algorithm": ALGORITHM,
            "key": signature.key_id,
            "signature": base64.b64encode(signature.value).decode(),
        }
    ).encode()


def decode(label: str, text: bytes) -> Signature:
    """The signature SIGNATURE.json holds; :class:`BundleRejected` for anything else."""
    try:
        data = atomic.loads(text)
    except ValueError as e:
        raise BundleRejected(label, f"{SIGNATURE} is not JSON ({why(e)})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BundleRejected(label, f"{SIGNATURE} is not a {FORMAT} object")
    if data.get("algorithm") != ALGORITHM:
        raise BundleRejected(
            label, f"{SIGNATURE} uses algorithm {data.get('algorithm')!r}; only {ALGORITHM}"
        )
    key, value = data.get("key"), data.get("signature")
    if not isinstance(key, str) or len(key) != KEY_ID_CHARS or not isinstance(value, str):
        raise BundleRejected(label, f"{SIGNATURE} has no valid key id and signature")
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise BundleRejected(label, f"{SIGNATURE}'s signature is not base64") from None
    if len(raw) != SIGNATURE_BYTES:
        raise BundleRejected(label, f"{SIGNATURE}'s signature is {len(raw)} bytes, not 64")
    return Signature(key, raw)


def member(signature: Signature) -> bytes:
    """SIGNATURE.json as a tar member: its header, its data, padded to whole blocks."""
    data = encode(signature)
    info = tarfile.TarInfo(SIGNATURE)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    head = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
    pad = -len(data) % tarfile.BLOCKSIZE
    return head + data + b"\0" * pad


def first_member(path: Path, manifest: str, max_bytes: int) -> tuple[Signature | None, bytes]:
    """The bundle's signature (None if unsigned) and the bytes of ``manifest``, read
    from the start of the archive only; the rest is left to a verify."""
    label = str(path)
    signature = None
    with path.open("rb") as raw:
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        try:
            for info in tar_stream.members(gz, MAX_HEADER_BYTES):
                limit = MAX_BYTES if info.name == SIGNATURE else max_bytes
                if info.size > limit:
                    raise BundleRejected(label, f"{info.name} is {info.size} bytes; limit {limit}")
                text = b"".join(tar_stream.chunks(gz, info.name, info.size))
                if info.name == SIGNATURE and signature is None:
                    signature = decode(label, text)
                elif info.name == manifest:
                    return signature, text
                else:
                    break
        except tar_stream.TarRejected as e:
            raise BundleRejected(label, e.reason) from None
    raise BundleRejected(label, f"no {manifest} at the start of the archive")


def write_signed(path: Path, out: Path, signature: Signature) -> None:
    """``out`` = the signature as a gzip member of its own, then ``path`` unchanged
    (atomically: a temp file beside ``out``, then a rename)."""
    head = gzip.compress(member(signature), mtime=0)
    with atomic.replacing(out) as f, path.open("rb") as src:
        f.write(head)
        shutil.copyfileobj(src, f, tar_stream.CHUNK)


def sign(
    path: Path,
    out: Path,
    key: SigningKey,
    manifest: str,
    max_manifest_bytes: int,
    *,
    verified_sha256: str,
) -> str:
    """Sign the unsigned bundle at ``path`` with ``key`` into ``out``; the key id.
    ``verified_sha256``: the sha256 of the manifest a verify read, which the one signed
    must be (a file swapped since is refused, never signed unread).
    :class:`BundleRejected` for a bundle that is signed already (sign the unsigned original)."""
    signature, text = first_member(path, manifest, max_manifest_bytes)
    if hashlib.sha256(text).hexdigest() != verified_sha256:
        raise BundleRejected(str(path), f"its {manifest} changed since it was verified")
    if signature is not None:
        raise BundleRejected(
            str(path),
            f"signed already (key {signature.key_id}); sign the unsigned original, or make "
            "it again with `registry bundle create --sign-key`",
        )
    write_signed(path, out, key.sign(DOMAIN, text))
    return key.key_id
