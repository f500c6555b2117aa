"""The remote tier: tuned entries on a redis server, shared by pods on every node (like
PyTorch Inductor's remote autotune cache).

Layout: one hash per slot, a field per fingerprint, the value an entry file's JSON
(:mod:`registry.remote.values`, where each value is read and written)::

    triton-warmup:entry:<kernel>:<sha256(canonical key)[:24]>
        <fingerprint digest>  ->  {"schema": 1, "kernel": ..., "fingerprint": ..., ...}

:class:`RemoteTier` is the facade its callers use, over four parts, each its own
module (as PyTorch Inductor's remote cache splits backend, encoding and policy):
the transport (:mod:`registry.remote.transport`: the client, deadlines, outages), the
codec (:mod:`registry.remote.codec`: bounded reads, decoding, signatures), the fenced
writes (:mod:`registry.remote.fence`) and the publish queue
(:mod:`registry.remote.publish`).

A fetch is one round trip (the exact field; every field where the policy forgives a
differing fingerprint) and picks as ``Store.lookup`` does. A publish merges into the
field under WATCH, as a local put merges into its file: an identical value writes
nothing, a newer version's entry is left alone. Nothing read is trusted: a value is
read only once its length is known to be within :data:`MAX_VALUE_BYTES` (one atomic
step on the server, ``registry.core.redis_url``), and a value that is too big, no entry, or
not the entry of its slot is skipped with one warning.

Signatures (``trust``, :mod:`registry.trust.remote_signature`): a value is the entry's JSON
in an envelope signed by the publishing pod's key, over the slot, the field and the
JSON. With trusted keys configured, a value unsigned, signed by an unknown key or not
verifying is refused before it is parsed (one warning naming the slot, the field and the
key; counted in ``stats.refused``): a miss, which costs a tuning, never the warm. A pod
without a signing key then publishes nothing (its values would be refused).

Outages (:mod:`registry.remote.transport`): every call ends within its deadline
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

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from registry.core.entry import Entry, canonical_key
from registry.core.errors import RegistryError, Superseded, shown
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.core.redis_url import SCHEMES, Read, is_redis, redacted
from registry.remote.calls import RemoteStats, WarnOnce, log
from registry.remote.codec import Codec
from registry.remote.fence import Fence
from registry.remote.freshness import Freshness
from registry.remote.publish import PublishQueue
from registry.remote.transport import Transport, Unanswered
from registry.remote.values import (
    MAX_VALUE_BYTES,
    PREFIX,
    SLOT_BYTES,
    SLOT_FIELDS,
    digest,
    read_field,
    read_fields,
    read_slots,
    scan_names,
    slot_name,
    write_field,
)
from registry.trust.signing import Trust

T = TypeVar("T")
__all__ = [
    "MAX_VALUE_BYTES", "PREFIX", "SLOT_BYTES", "SLOT_FIELDS", "RemoteStats", "RemoteTier",
    "digest", "read_field", "read_fields", "read_slots", "remote_tier", "scan_names",
    "slot_name", "write_field",
]  # fmt: skip


class RemoteTier:
    """Tuned entries on a redis server, shared by pods on every node: the facade over
    its transport (:class:`Transport`), codec (:class:`Codec`), fenced writes
    (:class:`Fence`) and publish queue (:class:`PublishQueue`). ``transport``: one
    built by the caller (a test's, on a fake client); ``url`` and the call options are
    then its own. ``freshness``: the newest issue time seen per key (:class:`Freshness`:
    an older signed value is refused, a replay), made once per process and kept on the
    volume by the entry point; in memory by default."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 1.0,
        retry_after_s: float = 30.0,
        password: str | None = None,
        trust: Trust | None = None,
        transport: Transport | None = None,
        freshness: Freshness | None = None,
    ) -> None:
        self.url = url
        self.stats = RemoteStats() if transport is None else transport.calls.stats
        warn = WarnOnce() if transport is None else transport.warn
        self.transport = transport or Transport(
            url,
            self.stats,
            warn,
            timeout_s=timeout_s,
            retry_after_s=retry_after_s,
            password=password,
        )
        self.codec = Codec(trust or Trust(), self.stats, warn, freshness)
        self.queue = PublishQueue(self.transport, Fence(self.codec, self.stats))
        self.transport.on_answer = self.queue.drain  # an answer ends an outage: publish

    @property
    def trust(self) -> Trust:
        """What a value read must be signed by; who signs ours."""
        return self.codec.trust

    @property
    def freshness(self) -> Freshness:
        """The newest issue time this pod has seen per key: what a replay is refused by."""
        return self.codec.freshness

    @property
    def client(self) -> Any:
        """The redis client (for a family of its own on this tier, and tests)."""
        return self.transport.client

    def describe(self) -> str:
        return self.transport.describe()

    @property
    def up(self) -> bool:
        """False while the tier is skipped after a failed call."""
        return self.transport.calls.up

    @property
    def timeout_s(self) -> float:
        """Each call's deadline unless told."""
        return self.transport.calls.timeout_s

    @property
    def retry_after_s(self) -> float:
        """How long the tier is skipped after a failed call."""
        return self.transport.calls.retry_after_s

    def deadline_for(self, size: int) -> float:
        """The deadline of a call that moves ``size`` bytes."""
        return self.transport.deadline_for(size)

    def call(
        self, fn: Callable[[Any], T], *, now: bool = False, deadline_s: float | None = None
    ) -> T | None:
        """``fn(client)``'s answer, for a family of its own on this tier (compiled models:
        ``registry.remote.models``); None when the tier is skipped, the call fails (an
        outage, handled as every call's; the call, all of ``fn``, ends within
        ``deadline_s``, by default ``timeout_s``) or a key holds another type. ``fn``
        answers a value that is never None. Never raises."""
        return self.transport.call(fn, now=now, deadline_s=deadline_s)

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
            name = slot_name(kernel, canonical_key(key))
        except RegistryError as e:
            log.warning("remote tier: no lookup of %s: %s", kernel, e)
            return None
        if not self.transport.ready(now):
            return None
        read = functools.partial(
            self.codec.entry, name=name, fingerprint=fingerprint, policy=policy
        )
        try:
            found = self.transport.attempt(read, key=name)
        except Unanswered:
            return None
        if found is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return found

    def sample(self, limit: int = 500) -> list[Entry]:
        """Up to ``limit`` slots' entries (:meth:`Codec.sample`), for ``explain``; asked
        even while the tier is skipped; [] when it fails."""
        return self.call(functools.partial(self.codec.sample, limit=limit), now=True) or []

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

    def opened(self, name: str, field: str, raw: Read, *, code: bool) -> bytes | None:
        """The payload of the value ``raw`` read at ``name`` (``field``) if the trust
        accepts its signature (``code``: it carries code or names the blobs that do);
        else None, counted and warned once, naming the key (None, unwarned, for no value
        or one too big to read)."""
        return self.codec.opened(name, field, raw, code=code)

    def seal(self, name: str, field: str, payload: bytes) -> bytes:
        """``payload`` as a value for ``name`` (``field``, "" for a plain key): signed by
        this pod's key, issued above anything this pod has seen there. Once the server
        holds it, say so with :meth:`sent`."""
        return self.codec.seal(name, field, payload)

    def sent(self, name: str, field: str, value: bytes) -> None:
        """The server holds ``value`` (:meth:`seal`) at ``name`` (``field``): from now on
        this pod refuses an older one there."""
        self.codec.sent(name, field, value)

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
        if not self.transport.ready():
            self.queue.keep(entry, seen)
            return False
        write = functools.partial(self.queue.fence.publish, entry=entry, seen=seen)
        name = slot_name(entry.kernel, entry.key_json)
        try:
            return bool(self.transport.attempt(write, key=name, passes=(Superseded,)))
        except Unanswered:
            self.queue.keep(entry, seen)
            return False

    def flush(self) -> int:
        """Publish the entries kept back during an outage, now (even while the tier is
        skipped); the number still unpublished, warned about. Never raises."""
        return self.queue.flush()

    @property
    def unpublished(self) -> int:
        """How many entries are kept back for a later publish."""
        return len(self.queue)

    def may_publish(self, *, code: bool = False) -> bool:
        """Whether what this pod publishes can be used: not when signatures are required
        and it has no key to sign with, nor unsigned code where pods refuse it (no
        trusted key, no opt-out), said once (:meth:`Codec.may_publish`)."""
        return self.codec.may_publish(self.describe(), code=code)


def remote_tier(
    url: str,
    *,
    timeout_s: float = 1.0,
    password: str | None = None,
    trust: Trust | None = None,
    seen: Path | None = None,
    max_age_s: float | None = None,
) -> RemoteTier | None:
    """The remote tier at ``url`` (each call's deadline: ``timeout_s``; ``password``
    where the URL has none; ``trust``: what values must be signed by, and this pod's
    key; ``seen``: the file where the newest issue time seen per key persists, None for
    memory only; ``max_age_s``: signatures older than that refused, None for never);
    None for "" or "off"."""
    if url.strip() in ("", "off"):
        return None
    if not is_redis(url):
        raise RegistryError(
            f"Remote tier URL {shown(redacted(url))} is not valid: "
            f"use {', '.join(SCHEMES)} or 'off'."
        )
    freshness = Freshness(seen, max_age_s=max_age_s)
    return RemoteTier(url, timeout_s=timeout_s, password=password, trust=trust, freshness=freshness)
