"""The trust of tests about what an artifact holds, not about who signed it."""

from registry.trust.signing import Trust

UNSIGNED_OK = Trust(allow_unsigned=True)  # TRITON_WARMUP_ALLOW_UNSIGNED=true: code taken unsigned
