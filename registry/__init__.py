"""Storage and distribution of tuned kernel configs. Knows nothing of kernels and imports
neither torch nor triton, so the sidecar can run from a slim image."""

from registry.core.config import KernelConfig, Measurement
from registry.core.entry import SCHEMA_VERSION, Entry, canonical_key
from registry.core.errors import BundleRejected, FingerprintMismatch, LockTimeout, RegistryError
from registry.core.fingerprint import (
    Fingerprint,
    Hardware,
    MatchPolicy,
    Software,
    cpu_fingerprint,
    detect,
    kernel_source_hash,
)
from registry.locks import Holder, backend_from_url, lock
from registry.storage.store import Store

__all__ = [
    "SCHEMA_VERSION",
    "BundleRejected",
    "Entry",
    "Fingerprint",
    "FingerprintMismatch",
    "Hardware",
    "Holder",
    "KernelConfig",
    "LockTimeout",
    "MatchPolicy",
    "Measurement",
    "RegistryError",
    "Software",
    "Store",
    "backend_from_url",
    "canonical_key",
    "cpu_fingerprint",
    "detect",
    "kernel_source_hash",
    "lock",
]
