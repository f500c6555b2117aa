"""Who made an artifact: Ed25519 keys, signatures, and the trust a pod places in them.

What the cache families carry is code (generated modules, pickled graphs, cubins), and a
sha256 only shows that parts agree with each other. A signature shows who vouched for
them: bundles (:mod:`registry.bundles.signature`) and remote-tier values
(:mod:`registry.trust.remote_signature`) carry one, checked against the trusted public keys
before anything they carry is used.

Keys are PEM files: a private key (PKCS#8, ``<name>.key``, mode 0600) and its public key
(SubjectPublicKeyInfo, ``<name>.pub``); ``registry keys generate`` writes both. A key is
named by its id: the first 16 hex digits of the sha256 of its 32 raw public bytes.

Every signed message starts with its domain (``bundle``, ``remote``), so a signature
made for one use is never valid for another. Ed25519 (with the ``cryptography``
library) because its keys and signatures are short, signing and verifying take tens of
microseconds, and it needs no parameters that can be chosen badly; a sigstore-style
keyless flow would need an identity provider and a transparency log reachable from
every pod, which clusters without egress do not have.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry.core import atomic
from registry.core.errors import BadInput, RegistryError, short

log = logging.getLogger(__name__)

ALGORITHM = "ed25519"
SIGNATURE_BYTES = 64
KEY_ID_CHARS = 16
PUBLIC_SUFFIX = ".pub"
PRIVATE_SUFFIX = ".key"
MAX_KEY_FILE_BYTES = 16 * 2**10  # a PEM Ed25519 key is ~120 bytes
MAX_TRUSTED_KEYS = 256
# a private key others may read, or anyone but its owner may write, is refused
PRIVATE_MODE_REFUSED = stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP
BUNDLE, REMOTE = "bundle", "remote"  # the domains: what a signature was made for
SIGNED, UNSIGNED_ALLOWED, CODE_REFUSED = "signed", "unsigned-allowed", "code-refused"  # modes
TRUST_MODES = (SIGNED, CODE_REFUSED, UNSIGNED_ALLOWED)
_CONFIGURE = (
    "set TRITON_WARMUP_TRUSTED_KEYS to a folder of public keys (`triton-warmup registry keys "
    "generate`), or TRITON_WARMUP_ALLOW_UNSIGNED=true to accept unsigned code"
)


class KeyFileError(RegistryError, BadInput):
    """A key file or trusted keys folder that cannot be used: bad input (exit 2)."""


class Untrusted(RegistryError):
    """An artifact refused: unsigned, signed by an unknown key, or a signature that does
    not verify. ``reason`` names the key where there is one."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} refused: {reason}")
        self.what = what
        self.reason = reason


@dataclass(frozen=True)
class Signature:
    """A signature and the id of the key that made it."""

    key_id: str
    value: bytes


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_CHARS]


def message(domain: str, payload: bytes) -> bytes:
    """What is signed: the domain, a NUL, then the payload."""
    return b"triton-warmup:" + domain.encode() + b"\0" + payload


class SigningKey:
    """A private key that signs what this pod makes."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.key_id = key_id(private.public_key())

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        """The Ed25519 private key in the PEM file ``path``; RegistryError naming the file,
        also for one that others may read or anyone but its owner may write."""
        try:
            key = serialization.load_pem_private_key(_read_key(path, private=True), password=None)
        except (TypeError, ValueError) as e:
            raise KeyFileError(
                f"Signing key {path} is not an unencrypted PEM private key ({short(str(e))})."
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"Signing key {path} is a {type(key).__name__}; need Ed25519.")
        return cls(key)

    def public_key(self) -> Ed25519PublicKey:
        return self._private.public_key()

    def sign(self, domain: str, payload: bytes) -> Signature:
        return Signature(self.key_id, self._private.sign(message(domain, payload)))


def load_public(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in the PEM file ``path``; RegistryError naming the file."""
    try:
        key = serialization.load_pem_public_key(_read_key(path))
    except ValueError as e:
        raise KeyFileError(
            f"Public key {path} is not a PEM public key ({short(str(e))})."
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"Public key {path} is a {type(key).__name__}; need Ed25519.")
    return key


def _read_key(path: Path, *, private: bool = False) -> bytes:
    # a Kubernetes Secret's files are links into its ..data folder: followed
    try:
        with atomic.open_bounded(path, MAX_KEY_FILE_BYTES, follow_links=True) as f:
            if private:  # the mode of what was opened, not of a name that may change
                _check_private(path, os.fstat(f.fileno()).st_mode)
            return b"".join(atomic.chunks(f, MAX_KEY_FILE_BYTES, path.name))
    except (OSError, ValueError) as e:
        raise KeyFileError(f"Key file {path} cannot be read: {e}") from None


def _check_private(path: Path, mode: int) -> None:
    """Refuse a private key that others may read, or anyone but its owner may write, as
    ssh does: a Secret mounted 0400, or 0440 for the pod's group (fsGroup), passes."""
    loose = mode & PRIVATE_MODE_REFUSED
    if loose:
        who = "others can read it" if loose & stat.S_IROTH else "others than its owner can write it"
        raise KeyFileError(
            f"Signing key {path} has mode {stat.S_IMODE(mode):04o}: {who}; chmod 0600 "
            "(a Secret: defaultMode 0400, or 0440 for the pod's group)."
        )


def trusted_keys(folder: Path) -> dict[str, Ed25519PublicKey]:
    """The public keys (``*.pub``) in ``folder`` by key id; RegistryError for a folder
    that is missing, holds none, or holds a file that is no Ed25519 public key."""
    if not folder.is_dir():
        raise KeyFileError(f"Trusted keys folder {folder} does not exist or is no folder.")
    found: dict[str, Ed25519PublicKey] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.name.endswith(PUBLIC_SUFFIX):
            continue
        if len(found) == MAX_TRUSTED_KEYS:
            raise KeyFileError(f"Trusted keys folder {folder} holds over {MAX_TRUSTED_KEYS} keys.")
        public = load_public(path)
        found[key_id(public)] = public
    if not found:
        raise KeyFileError(
            f"Trusted keys folder {folder} holds no public key (*{PUBLIC_SUFFIX}); "
            "make one with `registry keys generate`."
        )
    return found


def generate(out: Path, name: str) -> tuple[Path, Path]:
    """A new key pair written to ``out/<name>.key`` (mode 0600) and ``out/<name>.pub``;
    RegistryError where either exists already (a key is never overwritten)."""
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"Key name {name!r} is not a plain file name.")
    private_path, public_path = out / f"{name}{PRIVATE_SUFFIX}", out / f"{name}{PUBLIC_SUFFIX}"
    for path in (private_path, public_path):
        if path.exists():
            raise KeyFileError(f"{path} exists; a key is never overwritten.")
    out.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    atomic.write_bytes(private_path, pem, mode=0o600)
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    atomic.write_bytes(public_path, public)
    return private_path, public_path


@dataclass(frozen=True)
class Trust:
    """What this pod accepts and how it signs what it makes.

    - ``keys`` given: an artifact must be signed by one of them; unsigned, unknown-key
      and failing signatures are refused (:class:`Untrusted`).
    - ``allow_unsigned``: the explicit opt-out; unsigned artifacts and unknown keys are
      accepted, a signature by a trusted key that does not verify is still refused.
    - neither: trust is not configured, and safe by default: an artifact that carries
      code (a module, a kernel, a launcher, a cubin) is refused, since nothing can vouch
      for it; data that runs no code (tuned configs) is accepted unsigned.
    ``bundle_keys``: the keys bundles must be signed by instead (release keys), so that a
    pod's own key, trusted for remote values, cannot sign a bundle; None: ``keys``.
    ``signer``: this pod's key for what it publishes; without one it publishes unsigned.
    """

    keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    allow_unsigned: bool = False
    signer: SigningKey | None = None
    bundle_keys: Mapping[str, Ed25519PublicKey] | None = None

    @classmethod
    def load(
        cls,
        trusted_keys_dir: Path | None,
        *,
        bundle_keys_dir: Path | None = None,
        signing_key: Path | None = None,
        allow_unsigned: bool = False,
    ) -> Trust:
        keys = trusted_keys(trusted_keys_dir) if trusted_keys_dir is not None else {}
        bundle_keys = trusted_keys(bundle_keys_dir) if bundle_keys_dir is not None else None
        signer = SigningKey.load(signing_key) if signing_key is not None else None
        return cls(keys, allow_unsigned, signer, bundle_keys)

    def keys_for(self, domain: str) -> Mapping[str, Ed25519PublicKey]:
        """The keys an artifact of ``domain`` (:data:`BUNDLE`, :data:`REMOTE`) may be
        signed by."""
        if domain == BUNDLE and self.bundle_keys is not None:
            return self.bundle_keys
        return self.keys

    def requires(self, domain: str) -> bool:
        """Whether an unsigned artifact of ``domain`` is refused, whatever it carries."""
        return bool(self.keys_for(domain)) and not self.allow_unsigned

    @property
    def required(self) -> bool:
        """Whether any artifact must be signed."""
        return self.requires(BUNDLE) or self.requires(REMOTE)

    @property
    def configured(self) -> bool:
        """Whether any trusted key is configured."""
        return bool(self.keys_for(BUNDLE) or self.keys_for(REMOTE))

    @property
    def mode(self) -> str:
        """One word for status, doctor and the metrics: ``signed`` (trusted keys
        configured), ``unsigned-allowed`` (the opt-out) or ``code-refused`` (neither:
        unsigned code is refused, tuned configs accepted)."""
        if self.allow_unsigned:
            return UNSIGNED_ALLOWED
        return SIGNED if self.configured else CODE_REFUSED

    def describe(self) -> str:
        if self.required:
            bundles, remote = self.keys_for(BUNDLE), self.keys_for(REMOTE)
            if bundles is remote:
                return f"signatures required ({len(remote)} trusted keys: {', '.join(remote)})"
            return (
                f"signatures required: bundles by {len(bundles)} release keys "
                f"({', '.join(bundles) or 'none: code refused, tuned configs taken'}), "
                f"remote values by {len(remote)} keys "
                f"({', '.join(remote) or 'none: code refused, tuned configs taken'})"
            )
        if self.allow_unsigned:
            return "unsigned artifacts allowed, code included (TRITON_WARMUP_ALLOW_UNSIGNED=true)"
        return f"no trusted keys: code from bundles and the remote tier refused; {_CONFIGURE}"

    def check(
        self,
        what: str,
        domain: str,
        payload: bytes,
        signature: Signature | None,
        *,
        code: bool = True,
    ) -> None:
        """Raise :class:`Untrusted` unless ``signature`` vouches for ``payload`` as this
        trust requires of ``domain``; ``what`` names the artifact in the message.
        ``code``: the artifact carries code (refused unsigned when no key is trusted);
        False for data that runs none (tuned configs)."""
        keys = self.keys_for(domain)
        if not keys:
            if code and not self.allow_unsigned:
                signed = "unsigned" if signature is None else f"signed by {signature.key_id}"
                raise Untrusted(what, f"{signed}, and no trusted keys are configured; {_CONFIGURE}")
            return
        required = self.requires(domain)
        if signature is None:
            if required:
                raise Untrusted(what, "unsigned; a signature by a trusted key is required")
            return
        public = keys.get(signature.key_id)
        if public is None:
            if required:
                raise Untrusted(what, f"signed by unknown key {signature.key_id}")
            return
        try:
            public.verify(signature.value, message(domain, payload))
        except InvalidSignature:
            raise Untrusted(
                what, f"signature by key {signature.key_id} does not verify (tampered)"
            ) from None

    def sign(self, domain: str, payload: bytes) -> Signature | None:
        return None if self.signer is None else self.signer.sign(domain, payload)


def announce(trust: Trust) -> None:
    """Log, once at a process's start, what it trusts: the opt-out is never silent."""
    level = logging.INFO if trust.mode == SIGNED else logging.WARNING
    log.log(level, "trust: %s", trust.describe())
