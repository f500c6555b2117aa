"""The remote tier's writes (:mod:`registry.remote.tier`): an entry merged into its field
under WATCH, as a local put merges into its file, and fenced by what the field held.

An identical value writes nothing, a newer version's entry is left alone, a value that is
no entry is replaced (as a local put replaces a corrupt file). A tuner notes what its
entry's field holds before it decides to tune (``RemoteTier.seen``), and publishes with
that note: the publish is refused, :class:`registry.core.errors.Superseded` carrying the entry
the field holds, when the field changed since (another pod stored it first), checked
under the same WATCH as the merge.
"""

from __future__ import annotations

from typing import Any

from registry.core import redis_url
from registry.core.entry import Entry, NewerSchema
from registry.core.errors import RegistryError, Superseded
from registry.remote.calls import RemoteStats, log
from registry.remote.codec import Codec
from registry.remote.values import MAX_VALUE_BYTES, digest, read_field, slot_name, write_field

WATCH_TRIES = 5  # a publish that loses this many races to other writers gives up


class Fence:
    """Merges an entry into its field on the server, refused when its fence is stale."""

    def __init__(self, codec: Codec, stats: RemoteStats) -> None:
        self.codec = codec
        self.stats = stats

    def publish(self, client: Any, entry: Entry, seen: str | None = None) -> bool:
        """Merge ``entry`` into its field through ``client``; True when the server holds
        it. ``seen``: :class:`Superseded` unless the field still holds what it held then."""
        import redis  # redis is optional: a tier without it fails when it is built

        name, field = slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest()
        with client.pipeline() as pipe:
            for _ in range(WATCH_TRIES):
                try:
                    pipe.watch(name)
                    held = read_field(pipe, name, field)
                    if seen is not None and digest(held) != seen:
                        pipe.unwatch()
                        self._superseded(name, field)
                        raise Superseded(
                            f"{name} {field[:12]}", held=self.codec.held(name, field, held)
                        )
                    data = self._merged(name, field, held, entry)
                    if data is None or data == held:  # refused, or already there
                        pipe.unwatch()
                        return data is not None
                    pipe.multi()
                    write_field(pipe, name, field, data)
                    pipe.execute()
                    self.codec.sent(name, field, data)
                    self.stats.published += 1
                    return True
                except redis.exceptions.WatchError:
                    continue  # another writer changed the slot: merge with theirs
        log.warning("remote tier: %s not published, %d writers raced", name, WATCH_TRIES)
        return False

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
                merged = self.codec.stored(name, field, held).merge(entry)  # another fp's: raises
            except NewerSchema:
                self.codec.warn(name, field, "not publishing: a newer version's entry holds it")
                return None
            except RegistryError as e:  # replaced, as a local put replaces a corrupt file
                log.warning(
                    "remote tier: %s field %s: replacing a value that is no entry (%s)",
                    name,
                    field[:12],
                    e,
                )
        return self.codec.sealed(name, field, merged)
