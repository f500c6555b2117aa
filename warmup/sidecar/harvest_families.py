"""The harvest of every cache family after ready, naming none (``registry.families``).

- Files a family takes one by one (``Family.file_folders``, ``file_kind``,
  ``harvest_file``): each checked and kept on the volume by its family, what it shares
  handed to the :class:`~warmup.sidecar.harvest_publish.Publisher`, counted under the
  label its family gives its kind; a second event of a file harvested already is not a
  second harvest.
- Each family's watched folders (``Family.watched``; the Inductor cache always) saved
  whole (``Family.harvest``), after the shapes the server's models learned are merged
  into the volume's, each family counted under its name.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from registry import families
from registry.families import Family, Scope
from registry.families.base import Declared
from registry.families.file_harvest import FileLimits, Refused, temporary
from registry.remote.tier import RemoteTier
from registry.storage.store import Store
from warmup.caches import families as warm_families
from warmup.compiled import learned
from warmup.core.manifest import Manifest, ManifestError, load_manifest
from warmup.core.metrics import ServeMetrics
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.sidecar.harvest_host import HarvestHost, record_host
from warmup.sidecar.harvest_publish import Publisher
from warmup.sidecar.harvest_queue import FOLDERS
from warmup.sidecar.watcher import Stat, stat_key

log = logging.getLogger(__name__)
MAX_REMEMBERED = 100_000  # entries harvested, so a second event of one is not a second harvest


class FamilyHarvest:
    """Every family's part of the harvest for one pod; ``store``: the registry a family's
    harvest puts entries into (called only when it has some)."""

    def __init__(
        self,
        services: Services,
        metrics: ServeMetrics,
        *,
        publisher: Publisher,
        store: Callable[[], Store],
        limits: FileLimits,
    ) -> None:
        self.services = services
        self.settings = settings = services.settings
        self.metrics = metrics
        self.publisher = publisher
        self.store = store
        self.limits = limits
        self.learned_dir = settings.paths.metrics_dir
        self.families = families.every()
        self._owners = {kind: f for f in self.families for kind in f.file_kinds}
        self._done: OrderedDict[str, Stat] = OrderedDict()  # harvested: path -> its stat key

    @property
    def remote(self) -> RemoteTier | None:
        return self.publisher.remote

    # ---- what is watched, and what a new file is ----------------------------------------

    @functools.cached_property
    def scope(self) -> Scope:
        """The families' scope for this pod's manifest, no host yet (read once)."""
        where = warm_families.scope(self.services, self.manifest(), models=False)
        return replace(where, store=self.store)

    @functools.cached_property
    def folders(self) -> list[Path]:
        """Every family's watched folders (the Inductor cache whatever it declares)."""
        found = {self.settings.folders.inductor_cache_dir}
        for family in self.families:
            found.update(family.watched(self.scope))
        return sorted(found)

    @functools.cached_property
    def file_folders(self) -> list[Path]:
        """The folders whose files families take one by one."""
        found = (p for family in self.families for p in family.file_folders(self.scope))
        return list(dict.fromkeys(found))

    def kind(self, path: Path) -> str | None:
        """What a new file is: a kind a family takes one by one, :data:`FOLDERS` (in a
        watched folder, or a model's new shape), or None."""
        if any(folder in path.parents for folder in self.file_folders):
            kinds = (family.file_kind(self.scope, path) for family in self.families)
            return next((kind for kind in kinds if kind is not None), None)
        if any(folder in path.parents for folder in self.folders) and not temporary(path.name):
            return FOLDERS
        if path.parent == self.learned_dir and path.name.startswith(learned.PREFIX):
            return FOLDERS  # a model's new shape: merged with the models' artifacts
        return None

    def takes_one_by_one(self, kind: str) -> bool:
        return kind in self._owners

    def dropped(self, kind: str) -> None:
        """An entry of ``kind`` dropped past the queue's bound, counted."""
        self.count(self._label(kind), "dropped")

    def manifest(self) -> Manifest | None:
        if not self.settings.paths.manifest.exists():
            return None  # the sidecar says so itself; the Inductor cache is still kept
        try:
            return load_manifest(self.settings.paths.manifest)
        except (ManifestError, OSError) as e:
            log.warning("harvest: the manifest is unreadable, no declared folder kept: %s", e)
            return None

    # ---- the harvests -------------------------------------------------------------------

    def file(self, kind: str, path: Path, host: HarvestHost) -> str:
        """One file its family takes, checked and kept: harvested, deduplicated,
        refused, or seen (another event of a file harvested already)."""
        stamp = stat_key(path)
        if stamp is not None and self._done.get(str(path)) == stamp:
            return "seen"
        family, label = self._owners[kind], self._label(kind)
        where = replace(
            self.scope,
            fingerprint=host.fingerprint,
            triton_env=host.triton_env,
            remote=self.remote,
        )
        try:
            done = family.harvest_file(where, kind, path, self.limits)
        except Refused as e:
            log.warning("harvest: refused %s %s: %s", kind, self._shown(path), e)
            self.count(label, "refused")
            return "refused"
        self.publisher.publish(done.uploads)
        self.count(label, done.result, done.size)
        if stamp is not None:
            self._done[str(path)] = stamp
            while len(self._done) > MAX_REMEMBERED:
                self._done.popitem(last=False)
        return done.result

    def watched(self, status: RunStatus, host: HarvestHost) -> str:
        """The shapes the server's models learned merged into the volume's, then each
        family's watched folders saved again and counted by family: the models the run
        warmed (rank 0's, by their key digests) and the folders the manifest declares."""
        new_files = 0
        manifest = self.manifest()
        if manifest is not None:
            try:
                new_files += learned.merge(self.learned_dir, self.services.volume.learned, manifest)
            except OSError as e:
                log.warning("harvest: learned shapes not merged: %s", e)
        warmed = tuple(
            Declared(model.name, model.key_digest)
            for model in status.models
            if model.rank == 0 and model.key_digest and not model.failed
        )
        where = warm_families.scope(  # the folders' engine keys as the server's image saw them
            self.services,
            manifest,
            triton_env=host.triton_env,
            models=False,
            engine_keys=status.engine_keys,
        )
        where = replace(where, fingerprint=host.fingerprint, models=warmed, remote=self.remote)
        for moved in warm_families.harvest(where):
            if moved.anything:
                result = (
                    "failed" if moved.failed else "harvested" if moved.copied else "deduplicated"
                )
                self.count(moved.family, result, moved.bytes)
                new_files += moved.copied
        record_host(status, host, self.learned_dir, self.services.volume.hosts, self.remote)
        return "harvested" if new_files else "deduplicated"

    # ---- metrics ------------------------------------------------------------------------

    def count(self, label: str, result: str, size: int = 0) -> None:
        """One entry of ``label`` (a family's, or one of its file kinds'), by result."""
        self.metrics.harvest_entries.labels(label, result).inc()
        if size and result == "harvested":
            self.metrics.harvest_bytes.labels(label).inc(size)

    def _label(self, kind: str) -> str:
        owner: Family | None = self._owners.get(kind)
        return owner.file_kinds[kind] if owner is not None else kind

    def _shown(self, path: Path) -> str:
        for root in self.file_folders:
            if root in path.parents:
                return path.relative_to(root).as_posix()
        return str(path)
