"""Keyed folders: the shared part of every family that keeps one folder's files per
declared thing, key and host (a model's Inductor artifacts, a declared engine folder).

Each declared thing (:class:`~registry.families.base.Declared`) is stored as an index
and content-addressed blobs under the family's root on the volume
(:mod:`registry.caches.inductor_cache`'s layout: ``models/<name>/<gpu>/<software>/<key>.json``
and ``blobs/``): restored only for the same key and an equal fingerprint, each file
checked against its hash on the way. A subclass says where its root is, what it
declares and where each thing's folder is in the pod; the rest is here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.caches import inductor_cache
from registry.core.errors import RegistryError, named
from registry.core.explain import Differences, Prediction, fingerprint_differences, predict
from registry.core.fingerprint import Fingerprint
from registry.families.base import Declared, Family, Host, Moved, Scope, Sources
from registry.remote import models as remote_models

if TYPE_CHECKING:
    from registry.bundles.bundle import Bundle
    from registry.remote.tier import RemoteTier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ItemRestore:
    """One declared thing's restore: "hit", "hit (N artifacts to compile ...)", "miss:
    why" or "failed: why", and how long it took."""

    outcome: str
    seconds: float
    copied: int = 0
    present: int = 0
    will_miss: str = ""  # restored, but its user will not hit it: why, and the fix

    @property
    def hit(self) -> bool:
        return self.outcome.startswith("hit")


class KeyedFolders(Family):
    """A family of one folder per declared thing, key and host."""

    needs_host = True
    namespace = ""  # its indexes' namespace on the remote tier (remote_models)
    remade = "to make again"
    nothing_declared = "nothing declared"  # what becomes of a file a restore could not give back
    thing = "model"  # what one declared thing is, in a restore's words

    def root(self, scope: Scope) -> Path:
        """The family's folder on the volume."""
        root = self.volume_root(scope.volume)
        assert root is not None, "a keyed family has a folder on the volume"
        return root

    def declared(self, scope: Scope) -> Sequence[Declared]:
        """What the manifest declares of this family."""
        raise NotImplementedError

    def folder(self, scope: Scope, item: Declared) -> Path:
        """Where ``item``'s files are in this pod."""
        raise NotImplementedError

    def restore(self, scope: Scope) -> Moved:
        """Each declared thing stored for this host, into its folder (nothing before the
        host's fingerprint is known)."""
        moved = Moved(self.name)
        if scope.fingerprint is None:
            return moved
        for item in self.declared(scope):
            done = self.restore_one(scope, item)
            moved.copied, moved.present = moved.copied + done.copied, moved.present + done.present
            if not done.hit:
                moved.notes.append(f"{item.name}: {done.outcome}")
            elif done.will_miss:
                moved.notes.append(f"{item.name}: restored, but {done.will_miss}")
        return moved

    def restore_one(self, scope: Scope, item: Declared) -> ItemRestore:
        """``item``'s files for this host into its folder; never raises (a part that
        cannot be restored is compiled or written again by its user)."""
        clock = time.perf_counter()
        if scope.fingerprint is None or item.error:
            outcome = f"miss: {item.error or 'the host is not known yet'}"
            return ItemRestore(outcome, time.perf_counter() - clock)
        try:
            self.fetch(scope, item)
            done = inductor_cache.restore(
                self.root(scope),
                self.folder(scope, item),
                model=item.name,
                key_digest=item.key_digest,
                fingerprint=self.host(scope),
                thing=self.thing,
            )
        except (OSError, RegistryError) as e:
            outcome = f"failed: {named(e)}"
            log.info("%s %s: restored (%s)", self.name, item.name, outcome)
            return ItemRestore(outcome, time.perf_counter() - clock)
        broken = done.quarantined + done.missing
        outcome = "hit" + (f" ({broken} artifacts {self.remade})" if broken else "")
        if done.index is None:
            outcome = f"miss: {done.why_not}"
        _, why = self.will_miss(scope, item, self.host(scope)) if done.index else ({}, "")
        if why:  # the content may still hit in part: it stays restored, and is said
            log.warning("%s %s: restored (%s), but %s", self.name, item.name, outcome, why)
        else:
            log.info("%s %s: restored (%s)", self.name, item.name, outcome)
        seconds = time.perf_counter() - clock
        return ItemRestore(outcome, seconds, done.copied, done.present, will_miss=why)

    def will_miss(
        self, scope: Scope, item: Declared, fingerprint: Fingerprint
    ) -> tuple[Differences, str]:
        """Why ``item``'s copy on the volume for ``fingerprint``, restored whole, will
        still miss in its user: the factors that differ (``{factor: (this pod's,
        stored)}``) and one line (``the engine will miss: ...``) with what to do;
        ``({}, "")`` by default (a keyed family's things hit on their key and host alone)."""
        return {}, ""

    def fetch(self, scope: Scope, item: Declared) -> bool:
        """``item``'s index and blobs from the remote tier into the volume, when the
        volume lacks them; whether the volume holds them now. Never raises."""
        return self.stored(scope, item) or self._remote(remote_models.fetch, scope, item)

    def publish(self, scope: Scope, item: Declared) -> bool:
        """``item``'s index for this host, and the blobs the tier lacks, onto the
        remote tier; False without one, or on any failure (never raises)."""
        return self._remote(remote_models.publish, scope, item)

    def _remote(self, call: Callable[..., bool], scope: Scope, item: Declared) -> bool:
        """``call`` (:func:`remote_models.fetch` or ``publish``) for ``item`` on this
        host, in the family's folder and namespace; False without a tier or a host."""
        if scope.remote is None or scope.fingerprint is None:
            return False
        return call(
            scope.remote,
            self.root(scope),
            model=item.name,
            key_digest=item.key_digest,
            fingerprint=self.host(scope),
            namespace=self.namespace,
        )

    def save(self, scope: Scope) -> Moved:
        """Each declared thing's folder that holds files and is not stored yet for this
        host, onto the volume (the harvest saves it again after traffic)."""
        return self._saved(scope, again=False)

    def host(self, scope: Scope) -> Fingerprint:
        """The fingerprint its things are stored under for this host (the scope's)."""
        assert scope.fingerprint is not None, "the host is known"
        return scope.fingerprint

    def watched(self, scope: Scope) -> list[Path]:
        return sorted({self.folder(scope, item) for item in self.declared(scope)})

    def harvest(self, scope: Scope) -> Moved:
        """Each declared thing's folder saved again (what traffic added to it is kept)
        and published; the key kept is the one already stored where the scope's has
        none (a thing known by its digest alone, as a run's status gives it)."""
        return self._saved(scope, again=True)

    def _saved(self, scope: Scope, *, again: bool) -> Moved:
        """Each declared thing's folder that holds files onto the volume (``again``: also
        one stored already), then published. A folder with no files, or with fewer than
        its stored index lists (a folder this container does not share with the
        server), is never saved: it would replace what the fleet stored with less."""
        moved = Moved(self.name)
        if scope.fingerprint is None:
            return moved
        for item in self.declared(scope):
            if item.error:
                continue
            try:
                saved = self._save_one(scope, item, again=again)
            except (OSError, RegistryError) as e:
                moved.notes.append(f"{item.name}: not saved ({named(e)})")
                continue
            if saved is None:
                continue
            moved.copied, moved.bytes = moved.copied + saved.new_blobs, moved.bytes + saved.bytes
            moved.present += saved.files - saved.new_blobs
            self.publish(scope, item)
        return moved

    def _save_one(
        self, scope: Scope, item: Declared, *, again: bool
    ) -> inductor_cache.Saved | None:
        """``item``'s folder saved, or None where there is nothing to save."""
        folder = self.folder(scope, item)
        held = sum(1 for _ in inductor_cache.cache_files(folder)) if folder.is_dir() else 0
        stored = self._stored_files(scope, item)
        if held == 0 or (stored is not None and (not again or held < stored)):
            return None
        return inductor_cache.save(
            folder,
            self.root(scope),
            model=item.name,
            key_digest=item.key_digest,
            key=item.key or self._stored_key(scope, item),
            fingerprint=self.host(scope),
        )

    def _stored_files(self, scope: Scope, item: Declared) -> int | None:
        """How many files ``item``'s stored index lists; None when none is stored (an
        unreadable one counts as none: it is replaced)."""
        if not self.stored(scope, item):
            return None
        files = self.stored_files(scope, item)
        return len(files) if files else None

    def stored_files(self, scope: Scope, item: Declared) -> dict[str, Any]:
        """The files ``item``'s stored index lists for this host (relative path ->
        ``[sha256, size]``); empty when none is stored or it cannot be read."""
        path = inductor_cache.index_path(
            self.root(scope), item.name, item.key_digest, self.host(scope)
        )
        try:
            return dict(inductor_cache.read_index(path)["files"])
        except (OSError, RegistryError):
            return {}

    def _stored_key(self, scope: Scope, item: Declared) -> dict[str, object]:
        assert scope.fingerprint is not None
        path = inductor_cache.index_path(
            self.root(scope), item.name, item.key_digest, self.host(scope)
        )
        try:
            return dict(inductor_cache.read_index(path).get("key", {}))
        except (OSError, RegistryError):
            return {}

    def stored(self, scope: Scope, item: Declared) -> bool:
        """Whether the volume holds ``item``'s index for this host (an unreadable volume
        holds nothing)."""
        assert scope.fingerprint is not None
        path = inductor_cache.index_path(
            self.root(scope), item.name, item.key_digest, self.host(scope)
        )
        try:
            return path.is_file()
        except OSError:
            return False

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        """Each declared thing: the volume's, the pending bundles' and the remote tier's
        indexes of it, against its key and this host's fingerprint."""
        items = self.declared(scope)
        if not items:
            return predict(self.name, [], note=self.nothing_declared)
        bundled = {rel for b in sources.bundles for rel in self.bundle_indexes(b)}
        held: list[Differences] = []
        missing, notes = 0, []
        for item in items:
            if item.error:
                notes.append(f"{item.name}: {item.error}")
                continue
            found = self.differences(scope, item, host, bundled, sources)
            if found is None:
                missing += 1
                continue
            if not found:  # a hit on its key and host: what the volume's copy was written under
                found, why = self.will_miss(scope, item, host.fingerprint)
                notes += [f"{item.name}: restored, but {why}"] if why else []
            held.append(found)
        return predict(self.name, held, missing=missing, note="; ".join(notes))

    def differences(
        self, scope: Scope, item: Declared, host: Host, bundled: set[str], sources: Sources
    ) -> Differences | None:
        """How the closest stored copy of ``item`` differs from this host ({}: a hit;
        None: none is stored)."""
        relpath = inductor_cache.index_relpath(item.name, item.key_digest, host.fingerprint)
        if relpath in bundled:
            return {}
        found = inductor_cache.model_differences(
            self.root(scope), item.name, item.key_digest, host.fingerprint
        )
        if found is None and sources.remote is not None:
            found = self.remote_differences(sources.remote, item, host)
        return found

    def remote_differences(
        self, remote: RemoteTier, item: Declared, host: Host
    ) -> Differences | None:
        """How the remote tier's closest index of ``item`` differs (None: it holds none)."""
        fingerprint = host.fingerprint
        stored = remote_models.stored_fingerprints(
            remote, item.name, item.key_digest, fingerprint, namespace=self.namespace
        )
        if stored is None:
            return None
        if not stored:
            return {"model code or shapes": (item.key_digest[:12], "other keys")}
        return min((fingerprint_differences(fingerprint.diff(fp)) for fp in stored), key=len)

    def installed(self, info: Mapping[str, Any]) -> dict[str, Any]:
        """The indexes of this family a bundle install replaced, from its info (the
        generation's record): relative path -> the sha256 it had, or None."""
        key = getattr(self.bundled, "record_key", "")
        return dict(info.get(key) or {}) if key else {}

    def bundle_indexes(self, bundle: Bundle) -> Sequence[str]:
        """The indexes of this family a verified bundle carries."""
        return bundle.parts[self.name].indexes if self.name in bundle.parts else ()
