"""The remote tier: tuned entries on a redis server, shared by pods on every node (like
PyTorch Inductor's remote autotune cache).

Layout: one hash per slot, a field per fingerprint, the value an entry file's JSON
(:mod:`registry.remote_values`, where each value is read and written)::

    triton-warmup:entry:<kernel>:<sha256(canonical key)[:24]>
        <fingerprint digest>  ->  {"schema": 1, "kernel": ..., "fingerprint": ..., ...}

A fetch is one round trip (the exact field; every field where the policy forgives a
differing fingerprint) and picks as ``Store.lookup`` does. A publish merges into the
field under WATCH, as a local put merges into its file: an identical value writes
nothing, a newer version's entry is left alone. Nothing read is trusted: a value is
read only once its length is known to be within :data:`MAX_VALUE_BYTES` (one atomic
step on the server, ``registry.redis_url``), and a value that is too big, no entry, or
not the entry of its slot is skipped with one warning.

Signatures (``trust``, :mod:`registry.remote_signature`): a value is the entry's JSON
in an envelope signed by the publishing pod's key, over the slot, the field and the
JSON. With trusted keys configured, a value unsigned, signed by an unknown key or not
verifying is refused before it is parsed (one warning naming the slot, the field and the
key; counted in ``stats.refused``): a miss, which costs a tuning, never the warm. A pod
without a signing key then publishes nothing (its values would be refused).

Outages (:mod:`registry.remote_calls`): every call ends within its deadline
(``timeout_s``, for the whole call: a server that trickles its answer is cut there too)
and has no retries of its own. A call that fails logs one warning for the outage, then
the tier is skipped (no network) for ``retry_after_s`` and tried again; the local tier
works alone meanwhile. Two calls do not wait for the skip to end: a lookup that decides
whether to tune (``now=True``: one call against minutes of tuning) and
:meth:`RemoteTier.flush`. An entry not published while the tier was down is kept and
published once it answers again, or by ``flush`` at the end of a run.

Fences: a tuner notes what its entry's field holds before it decides to tune
(:meth:`RemoteTier.seen`), and publishes with that note: the publish is refused when
the field changed since (another pod stored it first), checked under the same WATCH as
the merge. This is what keeps pods that share only redis (each its own volume) to one
landed tuning per shape. A field that a restart emptied reads as never written; a
field the tier could not be asked about is fenced as empty: the publish lands only if
nobody published it since.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from registry import atomic, keys, redis_url, remote_signature
from registry.entry import Entry, NewerSchema, canonical_key
from registry.errors import RegistryError, Superseded, shown
from registry.fingerprint import Fingerprint, MatchPolicy
from registry.redis_url import SCHEMES, is_redis, redacted
from registry.remote_calls import Calls, RemoteStats
from registry.remote_values import (
    MAX_VALUE_BYTES,
    PREFIX,
    SLOT_BYTES,
    SLOT_FIELDS,
    digest,
    parse_entry,
    read_field,
    read_fields,
    read_slots,
    scan_names,
    slot_name,
    write_field,
)
from registry.signing import Trust, Untrusted
from registry.store import MAX_ENTRY_BYTES

log = logging.getLogger(__name__)
T = TypeVar("T")
__all__ = [
    "MAX_VALUE_BYTES", "PREFIX", "SLOT_BYTES", "SLOT_FIELDS", "RemoteStats", "RemoteTier",
    "digest", "read_field", "read_fields", "read_slots", "remote_tier", "scan_names",
    "slot_name", "write_field",
]  # fmt: skip

WATCH_TRIES = 5  # a publish that loses this many races to other writers gives up
SAMPLE_BYTES = 8 * 2**20  # what ``sample`` reads in all, for explain
SAMPLE_BATCH = 8  # slots asked for in one pipeline by ``sample``


class RemoteTier:
    """Tuned entries on a redis server, shared by pods on every node."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 1.0,
        retry_after_s: float = 30.0,
        password: str | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.url = url
        self.trust = trust or Trust()  # what a value read must be signed by; who signs ours
        self.stats = RemoteStats()
        self._warned: set[tuple[str, str]] = set()
        self._unpublished: dict[tuple[str, str], tuple[Entry, str | None]] = {}
        try:
            self.client: Any = redis_url.client(
                url, timeout_s=timeout_s, password=password, user="The remote tier"
            )
        except ValueError as e:
            raise RegistryError(
                f"Remote tier URL {shown(redacted(url))} is not valid: {e}"
            ) from None
        self.calls = Calls(  # the deadline of each call, and the outages
            self.describe(), self.stats, timeout_s=timeout_s, retry_after_s=retry_after_s
        )

    def describe(self) -> str:
        return f"redis at {redacted(self.url)}"

    @property
    def up(self) -> bool:
        """False while the tier is skipped after a failed call."""
        return self.calls.up

    @property
    def timeout_s(self) -> float:
        """Each call's deadline unless told."""
        return self.calls.timeout_s

    @property
    def retry_after_s(self) -> float:
        """How long the tier is skipped after a failed call."""
        return self.calls.retry_after_s

    def call(
        self, fn: Callable[[Any], T], *, now: bool = False, deadline_s: float | None = None
    ) -> T | None:
        """``fn(client)``'s answer, for a family of its own on this tier (compiled models:
        ``registry.remote_models``); None when the tier is skipped, the call fails (an
        outage, handled as every call's; the call, all of ``fn``, ends within
        ``deadline_s``, by default ``timeout_s``) or a key holds another type. ``fn``
        answers a value that is never None. Never raises."""
        if not now and not self.calls.ready():
            return None
        try:
            with self._unless_wrong_type("a key of another type"), self.calls.deadline(deadline_s):
                answer = fn(self.client)
                self._answered()
                return answer
        except Exception as e:
            self.calls.failed(e)
        return None

    # ---- reading -------------------------------------------------------------------

    def fetch(
        self,
        kernel: str,
        key: Mapping[str, Any],
        fingerprint: Fingerprint,
        policy: MatchPolicy = MatchPolicy.EXACT,
        *,
        now: bool = False,
    ) -> Entry | None:
        """The entry for ``kernel`` at ``key`` valid for ``fingerprint``, or None (a miss,
        a bad value, or the tier down). ``now``: asked even while the tier is skipped
        after a failure. Never raises."""
        try:
            key_json = canonical_key(key)
        except RegistryError as e:
            log.warning("remote tier: no lookup of %s: %s", kernel, e)
            return None
        if not now and not self.calls.ready():
            return None
        try:
            with self.calls.deadline():
                found = self._fetch(slot_name(kernel, key_json), fingerprint, policy)
        except Exception as e:
            self.calls.failed(e)
            return None
        self._answered()
        if found is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return found

    def _fetch(self, name: str, fingerprint: Fingerprint, policy: MatchPolicy) -> Entry | None:
        digest = fingerprint.digest()
        values: dict[bytes, bytes] = {}  # stays empty for a string at the slot's name
        with self._unless_wrong_type(name):
            if policy is MatchPolicy.EXACT:  # only the exact field can match
                raw = read_field(self.client, name, digest)
                values = self._readable(name, {digest.encode(): raw})
            else:
                values = self._within_limits(name, read_fields(self.client, name))
        candidates = {}
        for field, raw in values.items():
            entry = self._decode(name, field.decode(errors="replace"), raw)
            if entry is not None:
                candidates[entry.fingerprint.digest()] = entry
        return keys.best_fit(candidates, fingerprint, policy)

    def _readable(self, name: str, read: Mapping[bytes, redis_url.Read]) -> dict[bytes, bytes]:
        """The values read; one too big to read is skipped, with one warning."""
        values = {}
        for field, raw in read.items():
            if isinstance(raw, redis_url.Oversized):
                self._too_big(name, field, raw.size)
            elif raw is not None:
                values[field] = raw
        return values

    def _within_limits(self, name: str, read: redis_url.Fields) -> dict[bytes, bytes]:
        """The fields read; those left out (too big, past the slot's budget) warned about."""
        too_big = {f: size for f, size in read.oversized.items() if size > MAX_VALUE_BYTES}
        for field, size in too_big.items():
            self._too_big(name, field, size)
        if read.skipped > len(too_big):
            self._warn_once(
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
        self._warn_once(name, text, "skipping a value of %d bytes; limit %d", size, MAX_VALUE_BYTES)

    def _decode(self, name: str, field: str, raw: bytes) -> Entry | None:
        """The entry ``raw`` holds, if it is signed as the trust requires and is one
        filed under its own fingerprint."""
        payload = self.opened(name, field, raw)
        if payload is None:
            return None
        try:
            entry = parse_entry(payload)
        except NewerSchema as e:
            self._warn_once(name, field, "skipping a newer version's entry (%s)", e)
            return None
        except RegistryError as e:
            self._warn_once(name, field, "skipping a value that is no entry (%s)", e)
            return None
        if entry.fingerprint.digest() != field or slot_name(entry.kernel, entry.key_json) != name:
            self._warn_once(name, field, "skipping an entry filed under another slot")
            return None
        return entry

    def sample(self, limit: int = 500) -> list[Entry]:
        """Up to ``limit`` slots' entries (SCAN, then their fields, a few slots to a
        pipeline, :data:`SAMPLE_BYTES` in all), for ``explain``; asked even while the
        tier is skipped; [] when it fails."""

        def read(client: Any) -> list[Entry]:
            names = scan_names(client, f"{PREFIX}*", limit, type="hash")
            found: list[Entry] = []
            left = SAMPLE_BYTES
            for start in range(0, len(names), SAMPLE_BATCH):
                batch = names[start : start + SAMPLE_BATCH]
                budget = min(SLOT_BYTES, left // len(batch))
                for name, fields in zip(batch, read_slots(client, batch, budget), strict=True):
                    values = self._within_limits(name, fields)
                    left -= sum(len(raw) for raw in values.values())
                    for field, raw in values.items():
                        entry = self._decode(name, field.decode(errors="replace"), raw)
                        if entry is not None:
                            found.append(entry)
                if left < MAX_VALUE_BYTES:
                    break
            return found

        return self.call(read, now=True) or []

    def seen(self, kernel: str, key: Mapping[str, Any], fingerprint: Fingerprint) -> str:
        """What the field of ``kernel`` at ``key`` for ``fingerprint`` holds now (a digest;
        "" for nothing), for a fenced :meth:`publish`. While the tier is skipped after a
        failure, or when it does not answer: "", with no call (an outage costs no call per
        shape): the publish then lands only where the field is still empty, and a field
        filled meanwhile, by anyone, refuses it. Never an unfenced merge. Never raises."""
        if not self.up:
            return ""
        try:
            name = slot_name(kernel, canonical_key(key))
        except RegistryError:
            return ""
        field = fingerprint.digest()
        return self.call(lambda client: digest(read_field(client, name, field)), now=True) or ""

    # ---- writing -------------------------------------------------------------------

    def publish(self, entry: Entry, *, seen: str | None = None) -> bool:
        """Merge ``entry`` into its field; True when the server holds it. ``seen``
        (:meth:`seen`): refused, False, if the field changed since. One that the tier,
        down, did not take is kept for later (:meth:`flush`). Never raises."""
        try:
            return self.publish_fenced(entry, seen=seen)
        except Superseded:
            return False

    def publish_fenced(self, entry: Entry, *, seen: str | None) -> bool:
        """:meth:`publish`, but a publish refused by its fence raises :class:`Superseded`,
        with the entry the field holds (``held``), so the writer can take it. While the
        tier is skipped it is kept back with its fence, as any publish (:meth:`flush`
        tries it, fenced, at the end)."""
        if not self.may_publish():
            return False
        if not self.calls.ready():
            self._keep_back(entry, seen)
            return False
        try:
            with self.calls.deadline():
                stored = self._publish(entry, seen)
        except Superseded:
            self._answered()
            raise
        except Exception as e:
            self.calls.failed(e)
            self._keep_back(entry, seen)
            return False
        self._answered()
        return stored

    def flush(self) -> int:
        """Publish the entries kept back during an outage, now (even while the tier is
        skipped); the number still unpublished, warned about. Never raises."""
        if self._unpublished:
            self.calls.retry_now()
            self._publish_kept()
        if self._unpublished:
            log.warning(
                "remote tier %s: %d tuned entries not published (it did not answer); they "
                "are in this pod's local tier, and the next run publishes them as it tunes",
                self.describe(),
                len(self._unpublished),
            )
        return len(self._unpublished)

    @property
    def unpublished(self) -> int:
        return len(self._unpublished)

    def _keep_back(self, entry: Entry, seen: str | None) -> None:
        """The newest entry of its field (the local store's merge of all before it)."""
        field = (slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest())
        self._unpublished[field] = (entry, seen)

    def _publish_kept(self) -> None:
        """Publish the kept-back entries until one fails (the tier is down again); the
        tier is up again once they all went."""
        for field, (entry, seen) in list(self._unpublished.items()):
            try:
                with self.calls.deadline():
                    self._publish(entry, seen)
            except Superseded:
                pass  # counted and logged: another pod's entry stays
            except Exception as e:
                self.calls.failed(e)
                return
            del self._unpublished[field]
            if not self._unpublished:
                self._answered()

    def _publish(self, entry: Entry, seen: str | None = None) -> bool:
        name, field = slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest()
        with self._unless_wrong_type(name):
            return self._merge_into(name, field, entry, seen)
        return False  # a string at the slot's name: left alone

    def _merge_into(self, name: str, field: str, entry: Entry, seen: str | None) -> bool:
        """Read the field, merge, write it back unless another writer changed it since;
        with ``seen``, nothing unless the field still holds what it held then."""
        import redis

        with self.client.pipeline() as pipe:
            for _ in range(WATCH_TRIES):
                try:
                    pipe.watch(name)
                    held = read_field(pipe, name, field)
                    if seen is not None and digest(held) != seen:
                        pipe.unwatch()
                        self._superseded(name, field)
                        raise Superseded(f"{name} {field[:12]}", held=self._held(name, field, held))
                    data = self._merged(name, field, held, entry)
                    if data is None or data == held:  # refused, or already there
                        pipe.unwatch()
                        return data is not None
                    pipe.multi()
                    write_field(pipe, name, field, data)
                    pipe.execute()
                    self.stats.published += 1
                    return True
                except redis.exceptions.WatchError:
                    continue  # another writer changed the slot: merge with theirs
        log.warning("remote tier: %s not published, %d writers raced", name, WATCH_TRIES)
        return False

    def _held(self, name: str, field: str, raw: redis_url.Read) -> Entry | None:
        """The entry ``raw`` holds, if it is trusted and one of the slot ``name``."""
        payload = self.opened(name, field, raw) if isinstance(raw, bytes) else None
        if payload is None:
            return None
        try:
            entry = parse_entry(payload)
        except RegistryError:  # NewerSchema included
            return None
        return entry if slot_name(entry.kernel, entry.key_json) == name else None

    def _superseded(self, name: str, field: str) -> None:
        self.stats.superseded += 1
        log.info(
            "remote tier: %s field %s not published: another pod stored it first",
            name,
            field[:12],
        )

    def _merged(self, name: str, field: str, held: redis_url.Read, entry: Entry) -> bytes | None:
        """The value to store: ``entry`` merged with what ``held`` holds; None to write
        nothing (a newer version's entry, an entry too big to read back)."""
        merged = entry
        if held is not None:
            try:
                if isinstance(held, redis_url.Oversized):
                    raise RegistryError(f"{held.size} bytes; limit {MAX_VALUE_BYTES}")
                stored = parse_entry(remote_signature.unseal(self.trust, name, field, held))
                if slot_name(stored.kernel, stored.key_json) != name:
                    raise RegistryError("an entry of another slot")
                merged = stored.merge(entry)  # RegistryError for another fingerprint's
            except NewerSchema:
                self._warn_once(name, field, "not publishing: a newer version's entry holds it")
                return None
            except RegistryError as e:  # replaced, as a local put replaces a corrupt file
                log.warning(
                    "remote tier: %s field %s: replacing a value that is no entry (%s)",
                    name,
                    field[:12],
                    e,
                )
        data = atomic.dumps(merged.to_json()).encode()
        if len(data) > MAX_ENTRY_BYTES:
            log.warning("remote tier: %s is %d bytes; limit %d", name, len(data), MAX_ENTRY_BYTES)
            return None
        return remote_signature.seal(self.trust, name, field, data)

    # ---- trust ---------------------------------------------------------------------

    def opened(self, name: str, field: str, raw: bytes) -> bytes | None:
        """The payload of the value ``raw`` read at ``name`` (``field``) if the trust
        accepts its signature; else None, counted and warned once, naming the key."""
        try:
            return remote_signature.unseal(self.trust, name, field, raw)
        except Untrusted as e:
            self.stats.refused += 1
            self._warn_once(name, field, "refused: %s", e.reason)
            return None

    def may_publish(self) -> bool:
        """Whether what this pod publishes can be used: not when signatures are required
        and it has no key to sign with (its values would be refused), said once."""
        if not self.trust.requires(remote_signature.DOMAIN) or self.trust.signer is not None:
            return True
        self._warn_once(
            self.describe(),
            "",
            "publishing nothing: signatures are required and this pod has no signing key "
            "(TRITON_WARMUP_SIGNING_KEY)",
        )
        return False

    # ---- outages (registry.remote_calls) ---------------------------------------------

    def _answered(self) -> None:
        """A call answered: the outage, if any, is over; what it kept back is published."""
        self.calls.answered()
        if self._unpublished:
            self._publish_kept()

    @contextlib.contextmanager
    def _unless_wrong_type(self, name: str) -> Iterator[None]:
        """Redis's WRONGTYPE answer (someone stored a string at a slot's name) passes as a
        miss or a refused publish, warned once: one bad key is no outage."""
        import redis

        try:
            yield
        except redis.exceptions.ResponseError as e:
            if not str(e).startswith("WRONGTYPE"):
                raise
            self._warn_once(name, "", "not a hash, left alone (%s)", e)

    def _warn_once(self, name: str, field: str, message: str, *args: object) -> None:
        if (name, field) not in self._warned:
            self._warned.add((name, field))
            where = f"{name} field {field[:12]}" if field else name
            log.warning("remote tier: %s: " + message, where, *args)


def remote_tier(
    url: str, *, timeout_s: float = 1.0, password: str | None = None, trust: Trust | None = None
) -> RemoteTier | None:
    """The remote tier at ``url`` (each call's deadline: ``timeout_s``; ``password``
    where the URL has none; ``trust``: what values must be signed by, and this pod's
    key); None for "" or "off"."""
    if url.strip() in ("", "off"):
        return None
    if not is_redis(url):
        raise RegistryError(
            f"Remote tier URL {shown(redacted(url))} is not valid: "
            f"use {', '.join(SCHEMES)} or 'off'."
        )
    return RemoteTier(url, timeout_s=timeout_s, password=password, trust=trust)
