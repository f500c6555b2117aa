"""The remote tier's codec (:mod:`registry.remote.tier`): what a slot's values hold, read
within their limits, and the entries in them, signed as the trust requires.

Nothing read is trusted: a value is read only once its length is known to be within
:data:`registry.remote.values.MAX_VALUE_BYTES` (:mod:`registry.remote.values`), and a
value that is too big, unsigned where signatures are required, no entry, or not the
entry of its field and slot is skipped with one warning (:class:`Codec`). What a pod
publishes is the entry's JSON, bounded as a local entry file, in an envelope signed by
its key (:mod:`registry.trust.remote_signature`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from registry.core import atomic, redis_url
from registry.core.entry import Entry, NewerSchema
from registry.core.errors import RegistryError
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.remote.calls import RemoteStats, WarnOnce, log
from registry.remote.freshness import Freshness
from registry.remote.values import (
    MAX_VALUE_BYTES,
    PREFIX,
    SLOT_BYTES,
    SLOT_FIELDS,
    parse_entry,
    read_field,
    read_fields,
    read_slots,
    scan_names,
    slot_name,
)
from registry.storage import keys
from registry.storage.store import MAX_ENTRY_BYTES
from registry.trust import remote_signature
from registry.trust.signing import Trust, Untrusted

SAMPLE_BYTES = 8 * 2**20  # what ``sample`` reads in all, for explain
SAMPLE_BATCH = 8  # slots asked for in one pipeline by ``sample``


class Codec:
    """Reads a slot's values within their limits and opens the entries in them; seals
    what this pod publishes. ``trust``: what a value read must be signed by, and who
    signs ours; ``freshness``: the newest issue time seen per key, below which a signed
    value is refused (a replay), and above which ours are issued (in memory by default);
    values refused are counted in ``stats.refused``."""

    def __init__(
        self,
        trust: Trust,
        stats: RemoteStats,
        warn: WarnOnce,
        freshness: Freshness | None = None,
    ) -> None:
        self.trust = trust
        self.stats = stats
        self.warn = warn
        self.freshness = Freshness() if freshness is None else freshness

    # ---- reading -------------------------------------------------------------------

    def entry(
        self, client: Any, name: str, fingerprint: Fingerprint, policy: MatchPolicy
    ) -> Entry | None:
        """The entry of the slot ``name`` that fits ``fingerprint`` under ``policy``,
        picked as ``Store.lookup`` does, in one round trip."""
        digest = fingerprint.digest()
        if policy is MatchPolicy.EXACT:  # only the exact field can match
            values = self.readable(name, {digest.encode(): read_field(client, name, digest)})
        else:
            values = self.within_limits(name, read_fields(client, name))
        candidates = {}
        for field, raw in values.items():
            entry = self.decode(name, field.decode(errors="replace"), raw)
            if entry is not None:
                candidates[entry.fingerprint.digest()] = entry
        return keys.best_fit(candidates, fingerprint, policy)

    def sample(self, client: Any, limit: int) -> list[Entry]:
        """Up to ``limit`` slots' entries (SCAN, then their fields, a few slots to a
        pipeline, :data:`SAMPLE_BYTES` in all)."""
        names = scan_names(client, f"{PREFIX}*", limit, type="hash")
        found: list[Entry] = []
        left = SAMPLE_BYTES
        for start in range(0, len(names), SAMPLE_BATCH):
            batch = names[start : start + SAMPLE_BATCH]
            budget = min(SLOT_BYTES, left // len(batch))
            for name, fields in zip(batch, read_slots(client, batch, budget), strict=True):
                values = self.within_limits(name, fields)
                left -= sum(len(raw) for raw in values.values())
                for field, raw in values.items():
                    entry = self.decode(name, field.decode(errors="replace"), raw)
                    if entry is not None:
                        found.append(entry)
            if left < MAX_VALUE_BYTES:
                break
        return found

    def readable(self, name: str, read: Mapping[bytes, redis_url.Read]) -> dict[bytes, bytes]:
        """The values read; one too big to read is skipped, with one warning."""
        values = {}
        for field, raw in read.items():
            if isinstance(raw, redis_url.Oversized):
                self._too_big(name, field, raw.size)
            elif raw is not None:
                values[field] = raw
        return values

    def within_limits(self, name: str, read: redis_url.Fields) -> dict[bytes, bytes]:
        """The fields read; those left out (too big, past the slot's budget) warned about."""
        too_big = {f: size for f, size in read.oversized.items() if size > MAX_VALUE_BYTES}
        for field, size in too_big.items():
            self._too_big(name, field, size)
        if read.skipped > len(too_big):
            self.warn(
                name,
                "",
                "%d fields not read: over %d bytes each, or past the slot's limits "
                "(%d bytes, %d fields)",
                read.skipped - len(too_big),
                MAX_VALUE_BYTES,
                SLOT_BYTES,
                SLOT_FIELDS,
            )
        return read.values

    def _too_big(self, name: str, field: bytes, size: int) -> None:
        text = field.decode(errors="replace")
        self.warn(name, text, "skipping a value of %d bytes; limit %d", size, MAX_VALUE_BYTES)

    # ---- decoding ------------------------------------------------------------------

    def decode(self, name: str, field: str, raw: bytes) -> Entry | None:
        """The entry ``raw`` holds, if it is signed as the trust requires and is one
        filed under its own fingerprint; else None, warned once."""
        payload = self.opened(name, field, raw, code=False)
        if payload is None:
            return None
        try:
            entry = parse_entry(payload)
        except NewerSchema as e:
            self.warn(name, field, "skipping a newer version's entry (%s)", e)
            return None
        except RegistryError as e:
            self.warn(name, field, "skipping a value that is no entry (%s)", e)
            return None
        if entry.fingerprint.digest() != field or slot_name(entry.kernel, entry.key_json) != name:
            self.warn(name, field, "skipping an entry filed under another slot")
            return None
        return entry

    def held(self, name: str, field: str, raw: redis_url.Read) -> Entry | None:
        """The entry ``raw`` holds, if it is trusted and one of the slot ``name``; None
        otherwise, with no warning of its own (what a refused fence hands over)."""
        payload = self.opened(name, field, raw, code=False)
        if payload is None:
            return None
        try:
            entry = parse_entry(payload)
        except RegistryError:  # NewerSchema included
            return None
        return entry if slot_name(entry.kernel, entry.key_json) == name else None

    def stored(self, name: str, field: str, raw: bytes) -> Entry:
        """The entry ``raw`` holds at the slot ``name``: :class:`NewerSchema` for a
        newer version's, :class:`RegistryError` (``Untrusted`` included, not counted)
        for anything else than an entry of this slot."""
        opened = remote_signature.opened(self.trust, name, field, raw, code=False)
        replayed = self.freshness.refusal(name, field, opened)
        if replayed is not None:  # never merged: a merge would sign the replay anew
            self.stats.refused += 1
            raise Untrusted(f"remote value {name} field {field}", replayed)
        self.freshness.note(name, field, opened)  # what a publish merges with: ours goes above
        entry = parse_entry(opened.payload)
        if slot_name(entry.kernel, entry.key_json) != name:
            raise RegistryError("an entry of another slot")
        return entry

    def opened(self, name: str, field: str, raw: redis_url.Read, *, code: bool) -> bytes | None:
        """The payload of the value ``raw`` read at ``name`` (``field``) if the trust
        accepts its signature (``code``: it carries code or names the blobs that do) and
        it is no older than what this pod has seen there (:class:`Freshness`); else None,
        counted and warned once, naming the key. None for no value or one too big to
        read, with no warning."""
        if not isinstance(raw, bytes):
            return None
        try:
            opened = remote_signature.opened(self.trust, name, field, raw, code=code)
        except Untrusted as e:
            reason: str | None = e.reason
        else:
            reason = self.freshness.refusal(name, field, opened)
        if reason is not None:
            self.stats.refused += 1
            self.warn(name, field, "refused: %s", reason)
            return None
        return opened.payload

    # ---- encoding ------------------------------------------------------------------

    def sealed(self, name: str, field: str, entry: Entry) -> bytes | None:
        """``entry``'s value for ``field`` of the slot ``name``, signed by this pod's
        key; None for one over a local entry file's limit (warned)."""
        data = atomic.dumps(entry.to_json()).encode()
        if len(data) > MAX_ENTRY_BYTES:
            log.warning("remote tier: %s is %d bytes; limit %d", name, len(data), MAX_ENTRY_BYTES)
            return None
        return self.seal(name, field, data)

    def seal(self, name: str, field: str, payload: bytes) -> bytes:
        """``payload`` in its envelope for ``name`` (``field``), signed by this pod's key
        and issued above anything this pod has seen there; note it with :meth:`sent`
        once the server holds it."""
        issued = self.freshness.issue(name, field)
        return remote_signature.seal(self.trust, name, field, payload, issued=issued)

    def sent(self, name: str, field: str, value: bytes) -> None:
        """``value`` (from :meth:`seal`) is held at ``name`` (``field``): older values
        there are refused from now on."""
        self.freshness.note(name, field, remote_signature.own(self.trust, value))

    def may_publish(self, where: str, *, code: bool = False) -> bool:
        """Whether what this pod publishes can be used, said once about ``where`` (the
        tier) when not: not when signatures are required and it has no key to sign with,
        nor, for values that carry code (``code``), unsigned where the trust does not
        take unsigned code (no trusted key, no opt-out: pods like it refuse them)."""
        if self.trust.signer is not None:
            return True
        if self.trust.requires(remote_signature.DOMAIN):
            self.warn(
                where,
                "",
                "publishing nothing: signatures are required and this pod has no signing "
                "key (TRITON_WARMUP_SIGNING_KEY)",
            )
            return False
        if code and not self.trust.allow_unsigned:
            self.warn(
                where,
                "code",
                "publishing no code (compiled models, Triton kernels): unsigned, pods refuse "
                "it; set TRITON_WARMUP_SIGNING_KEY and TRITON_WARMUP_TRUSTED_KEYS to share it",
            )
            return False
        return True
