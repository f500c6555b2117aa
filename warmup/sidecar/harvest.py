"""Harvest after ready: what the server compiles under traffic is kept for the fleet.

The sidecar watches the server's ``TRITON_CACHE_DIR`` and Inductor cache with watchdog
(files created or renamed into place; nothing polls). It takes only finished entries:

- a Triton kernel when its group file appears (Triton writes the group last, by rename),
  with every file the group names;
- a Triton autotune result (``<hash>/<fn>.autotune.json``), written by rename;
- a Triton launcher stub (``<hash>/<name>.so``, host code: to the volume only);
- each cache family's watched folders (``registry.families``: the Inductor cache, each
  folder a manifest declares under ``caches:``) as a whole, once they have been quiet
  for ``INDUCTOR_QUIET_S``: each family saves every declared thing again from them
  (``Family.harvest``), so its index lists what traffic compiled too.

Each entry is checked before anything is written. It must be inside its folder, be
regular files (no links), be under the size caps, and have been compiled for this pod's
GPU and Triton (the run's fingerprint, from the status file). It is then copied into
the volume's families, where every pod started later restores it. Triton kernels get
their origin recorded for ``explain``. Autotune results are also imported into the
registry (a new generation, under the store's lock). Everything is published to the
remote tier, content-addressed, so N pods harvesting one kernel store it once.

An entry that fails a check is refused, with one log line and the metric
``triton_warmup_harvest_entries_total{result="refused"}``, and nothing is written. A
burst past ``TRITON_WARMUP_HARVEST_MAX_PER_MINUTE`` waits in a bounded queue; past the
queue, entries are dropped and counted. Nothing is harvested before the pod is ready:
the init container's own work is saved by its run. The harvest runs in the sidecar's
threads and never touches the server's process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from registry import atomic, families, hosts, importers, remote_triton, triton_cache
from registry.errors import RegistryError
from registry.families.base import Declared
from registry.fingerprint import Fingerprint
from registry.patterns import TRITON_CACHE_KEY
from registry.remote import RemoteTier
from registry.store import Store
from registry.triton_cache import GROUP_PREFIX, MAX_GROUP_BYTES, Origin
from warmup import families as warm_families
from warmup.compiled import learned
from warmup.manifest import Manifest, ManifestError, load_manifest
from warmup.metrics import ServeMetrics
from warmup.results import RankHost, RunStatus
from warmup.services import Services
from warmup.sidecar.watcher import Stat, stat_key

log = logging.getLogger(__name__)
EVENTS: list[type[FileSystemEvent]] = [FileCreatedEvent, FileMovedEvent, FileClosedEvent]
INDUCTOR_QUIET_S = 5.0  # a family's watched folders are saved once quiet this long
FOLDERS = "folders"  # the kind of an event in a family's watched folders
MAX_AUTOTUNE_BYTES = 2**20
MAX_UNPUBLISHED_BYTES = 64 * 2**20  # kept through a remote outage, then the oldest go
NICENESS = 19  # the harvest thread's: the lowest CPU priority
MAX_REMEMBERED = 100_000  # entries harvested, so a second event of one is not a second harvest


class Refused(Exception):
    """An entry that is not harvested; the message says why, in a few words."""


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = remote_triton.MAX_FILE_BYTES
    max_entry_bytes: int = 64 * 2**20  # a kernel's files together, held in memory once
    max_per_minute: int = 600
    max_pending: int = 10_000


class Harvester(FileSystemEventHandler):
    """Watch the server's caches and publish what it compiles; see the module's docstring."""

    def __init__(
        self,
        services: Services,
        metrics: ServeMetrics,
        *,
        remote: RemoteTier | None = None,
        limits: Limits | None = None,
        status: Callable[[], RunStatus | None] | None = None,
        store: Store | None = None,
    ) -> None:
        self.services = services  # the sidecar's
        self.settings = settings = services.settings
        self.metrics = metrics
        self.remote = remote
        self.limits = limits or Limits(max_per_minute=settings.sidecar.harvest_max_per_minute)
        self.triton_dir = settings.paths.triton_cache_dir
        self.inductor_dir = settings.paths.inductor_cache_dir
        self.learned_dir = settings.paths.metrics_dir
        self._status = status or (lambda: RunStatus.read(settings.paths.status_file))
        self._pending: OrderedDict[tuple[str, str], None] = OrderedDict()  # (kind, path)
        self._inductor_due: float | None = None
        self._wake = threading.Condition()
        self._stopped = False
        # the registry autotune results go to: the sidecar's own (it cleared the debris
        # at start), else one opened at the first import
        self._store = store
        self._sent: list[float] = []  # when the last minute's entries were harvested
        self._unpublished: OrderedDict[tuple[str, str], bytes] = OrderedDict()  # remote retries
        self._done: OrderedDict[str, Stat] = OrderedDict()  # harvested: path -> its stat key
        self._observer: BaseObserver | None = None
        self._worker: threading.Thread | None = None
        self.busy: deque[tuple[float, float]] = deque(maxlen=10_000)  # (start, end) of work
        self._was_ready = False
        self._ready_checked = -1.0

    # ---- watching ---------------------------------------------------------------------

    @functools.cached_property
    def folders(self) -> list[Path]:
        """Every family's watched folders for this pod's manifest (the Inductor cache
        whatever it declares), read once."""
        scope = warm_families.scope(self.services, self._manifest(), models=False)
        found = {self.inductor_dir}
        for family in families.every():
            found.update(family.watched(scope))
        return sorted(found)

    def _manifest(self) -> Manifest | None:
        if not self.settings.paths.manifest.exists():
            return None  # the sidecar says so itself; the Inductor cache is still kept
        try:
            return load_manifest(self.settings.paths.manifest)
        except (ManifestError, OSError) as e:
            log.warning("harvest: the manifest is unreadable, no declared folder kept: %s", e)
            return None

    def start(self) -> None:
        self._observer = Observer()
        for folder in (self.triton_dir, *self.folders):
            with contextlib.suppress(OSError):  # a read-only mount: it is there or not
                folder.mkdir(parents=True, exist_ok=True)
            self._watch(folder, recursive=True)
        # the server's folder, made by the server: learned shapes also merge at every
        # Inductor harvest, so a folder not there yet loses nothing
        self._watch(self.learned_dir, recursive=False)
        self._observer.start()
        self._worker = threading.Thread(target=self._run, daemon=True, name="harvest")
        self._worker.start()

    def _watch(self, folder: Path, *, recursive: bool) -> None:
        assert self._observer is not None
        if not folder.is_dir():
            log.info("harvest: %s is not there; not watched", folder)
            return
        self._observer.schedule(self, str(folder), recursive=recursive, event_filter=EVENTS)

    def stop(self, timeout: float = 1.0) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout)
        if self._worker is not None:
            self._worker.join(timeout)

    def on_any_event(self, event: FileSystemEvent) -> None:
        raw = getattr(event, "dest_path", "") or event.src_path
        path = Path(raw.decode() if isinstance(raw, bytes) else raw)
        kind = self._kind(path)
        if kind is not None:
            self.offer(kind, path)

    def _kind(self, path: Path) -> str | None:
        """What a new file is: a kernel's group, an autotune result, Inductor's, or none."""
        if path.parent.parent == self.triton_dir:
            if triton_cache.is_group(path.name):
                return "kernel"
            if path.name.endswith(".autotune.json"):
                return "autotune"
            if path.name.endswith(".so") and not _temporary(path.name):
                return "stub"
            return None
        if any(folder in path.parents for folder in self.folders) and not _temporary(path.name):
            return FOLDERS
        if path.parent == self.learned_dir and path.name.startswith(learned.PREFIX):
            return FOLDERS  # a model's new shape: merged with the models' artifacts
        return None

    def offer(self, kind: str, path: Path) -> None:
        """Queue an entry (the watcher's events; a test's too); dropped past the bound.
        Before the pod is ready nothing is queued: the run saves its own work."""
        if not self._ready():
            return
        with self._wake:
            if kind == FOLDERS:
                self._inductor_due = time.monotonic() + INDUCTOR_QUIET_S
            elif len(self._pending) >= self.limits.max_pending:
                self._count(kind, "dropped")
                return
            else:
                self._pending[(kind, str(path))] = None
            self._wake.notify()

    # ---- the worker -------------------------------------------------------------------

    def _ready(self) -> bool:
        """Whether the pod is ready; once it is, it stays so for this harvest (a status
        read on every event of a busy cache would cost the watcher's thread)."""
        if self._was_ready:
            return True
        now = time.monotonic()
        if now - self._ready_checked < 1.0:
            return False
        self._ready_checked = now
        status = self._status()
        self._was_ready = status is not None and self._host(status) is not None
        if self._was_ready and status is not None and not status.fingerprint:
            self._catch_up()
        return self._was_ready

    def _catch_up(self) -> None:
        """The host was told by the server (its init started no rank): what the server
        compiled before this harvest knew it was dropped, so the Triton cache is offered
        once as it is now, and the Inductor cache's save is due."""
        try:
            folders = sorted(p for p in self.triton_dir.iterdir() if p.is_dir())
        except OSError:
            folders = []
        for folder in folders:
            with contextlib.suppress(OSError):
                for path in sorted(folder.iterdir()):
                    kind = self._kind(path)
                    if kind is not None:
                        self.offer(kind, path)
        self.offer(FOLDERS, self.inductor_dir)

    def _host(self, status: RunStatus) -> tuple[Fingerprint, dict[str, str]] | None:
        """The fingerprint and Triton knobs what the server compiles is stored under:
        the warmup's (its ranks detected them), or, when the init container started no
        rank (``warmup.run.full_hit.leave_to_the_server``), what the server's rank 0
        detected; None while the pod is not ready or neither is known yet."""
        if not status.ready:
            return None
        if status.fingerprint:
            return Fingerprint.from_json(status.fingerprint), dict(status.triton_env)
        told = RankHost.read(self.learned_dir)
        if told is None:
            return None
        return Fingerprint.from_json(told.fingerprint), dict(told.triton_env)

    def _run(self) -> None:
        _yield_the_cpu()
        while (job := self._next()) is not None:
            started = time.time()
            try:
                result = self.harvest(*job)
            except Exception as e:  # never kill the harvest: the next entry goes on
                log.exception("harvest of %s failed: %s", job[1], e)
                result = "failed"
            if result not in ("waiting", "seen"):  # only work spends the rate
                with self._wake:
                    self._sent.append(time.monotonic())
                self.busy.append((started, time.time()))

    def _next(self) -> tuple[str, Path] | None:
        with self._wake:
            while not self._stopped:
                now = time.monotonic()
                if self._pending:
                    wait = self._rate_wait(now)
                    if wait <= 0:
                        (kind, path), _ = self._pending.popitem(last=False)
                        return kind, Path(path)
                elif self._inductor_due is not None and now >= self._inductor_due:
                    self._inductor_due = None
                    return FOLDERS, self.inductor_dir
                else:
                    wait = (self._inductor_due - now) if self._inductor_due else 3600.0
                self._wake.wait(max(wait, 0.01))
            return None

    def _rate_wait(self, now: float) -> float:
        self._sent = [t for t in self._sent if now - t < 60.0]
        if len(self._sent) < self.limits.max_per_minute:
            return 0.0
        return 60.0 - (now - self._sent[0])

    def harvest(self, kind: str, path: Path) -> str:
        """Check and publish one entry now; its result (harvested, deduplicated,
        refused, waiting: the pod is not ready yet)."""
        status = self._status()
        host = self._host(status) if status is not None else None
        if status is None or host is None:
            return "waiting"
        stamp = stat_key(path) if kind != FOLDERS else None
        if stamp is not None and self._done.get(str(path)) == stamp:
            return "seen"  # another event of an entry harvested already
        fingerprint, triton_env = host
        origin = Origin.of(fingerprint, triton_env)
        try:
            if kind == "kernel":
                result, size = self._kernel(path.parent, path.name, origin)
            elif kind == "autotune":
                result, size = self._autotune(path, origin, fingerprint)
            elif kind == "stub":
                result, size = self._stub(path)
            else:
                return self._folders(status, fingerprint, triton_env)  # counted by family
        except Refused as e:
            log.warning("harvest: refused %s %s: %s", kind, _shown(path, self.triton_dir), e)
            self._count(kind, "refused")
            return "refused"
        self._count(kind, result, size)
        if stamp is not None:
            self._done[str(path)] = stamp
            while len(self._done) > MAX_REMEMBERED:
                self._done.popitem(last=False)
        return result

    # ---- Triton kernels and autotune results --------------------------------------------

    def _kernel(self, folder: Path, group: str, origin: Origin) -> tuple[str, int]:
        self._check_folder(folder)
        with _opened(folder) as at:  # every read below is in this folder, never a link
            group_bytes = _read_at(at, group, MAX_GROUP_BYTES)
            names = self._group_names(folder, group_bytes)
            files: dict[str, bytes] = {}
            left = self.limits.max_entry_bytes
            for name in names:
                limit = min(self.limits.max_file_bytes, left)
                files[name] = _read_at(at, name, limit)
                left -= len(files[name])
        size = sum(map(len, files.values()))
        meta_name = group.removeprefix(GROUP_PREFIX)
        if meta_name not in files:
            raise Refused("its group does not name its metadata file")
        try:
            factors = triton_cache.metadata_factors(files[meta_name])
        except ValueError as e:
            raise Refused(f"unreadable metadata: {e}") from None
        foreign = triton_cache.compare(origin, factors)
        if foreign:
            factor, (mine, theirs) = next(iter(foreign.items()))
            raise Refused(f"compiled for {factor} {theirs}; this pod has {mine}")
        target = self.services.volume.triton_cache / folder.name
        new = self._write_new(target, {**files, group: group_bytes})
        self._record(origin, folder.name)
        self._publish(folder.name, {**files, group: remote_triton.group_value(files)})
        return ("harvested" if new else "deduplicated"), size

    def _autotune(self, path: Path, origin: Origin, fingerprint: Fingerprint) -> tuple[str, int]:
        folder = path.parent
        self._check_folder(folder)
        with _opened(folder) as at:
            data = _read_at(at, path.name, MAX_AUTOTUNE_BYTES)
        try:
            parsed = atomic.loads(data)
            if not isinstance(parsed.get("configs_timings"), list):
                raise ValueError("no configs_timings list")
        except (ValueError, AttributeError) as e:
            raise Refused(f"not an autotune result: {e}") from None
        target = self.services.volume.triton_cache / folder.name
        new = self._write_new(target, {path.name: data})
        self._record(origin, folder.name)
        if new:
            self._import(target / path.name, fingerprint)
        self._publish(folder.name, {path.name: data})
        return ("harvested" if new else "deduplicated"), len(data)

    def _stub(self, path: Path) -> tuple[str, int]:
        """A launcher stub Triton built for a kernel's signature (``<hash>/<name>.so``,
        host code: to the volume only, which the pod trusts as it trusts its own saves;
        never to the remote tier). A new signature costs a build of ~0.4 s otherwise."""
        folder = path.parent
        self._check_folder(folder)
        with _opened(folder) as at:
            data = _read_at(at, path.name, self.limits.max_file_bytes)
        if not data.startswith(b"\x7fELF"):
            raise Refused("not a shared object")
        new = self._write_new(self.services.volume.triton_cache / folder.name, {path.name: data})
        return ("harvested" if new else "deduplicated"), len(data)

    def _record(self, origin: Origin, folder: str) -> None:
        """The kernel's origin, in the harvests' record (``explain`` reads it): one for
        every harvesting sidecar, so a race loses a folder's record at worst."""
        triton_cache.record_origin(
            self.services.volume.triton_cache, origin, [folder], writer="harvest"
        )

    def _import(self, path: Path, fingerprint: Fingerprint) -> None:
        """An autotune result into the registry: a new generation, under its lock."""
        found = importers.import_triton_autotune_files([path], fingerprint)
        if found.entries:
            try:
                if self._store is None:  # one: a store clears killed writers' debris once
                    self._store = self.services.store()
                self._store.put_many(found.entries)
            except (OSError, RegistryError) as e:
                log.warning("harvest: %s not put in the registry: %s", path.name, e)

    def _check_folder(self, folder: Path) -> None:
        if folder.parent != self.triton_dir or not TRITON_CACHE_KEY.fullmatch(folder.name):
            raise Refused("not a folder of the Triton cache")

    def _group_names(self, folder: Path, raw: bytes) -> list[str]:
        try:
            children = triton_cache.parse_group(raw)
        except ValueError as e:
            raise Refused(f"unreadable group: {e}") from None
        names = []
        for name, child in children.items():
            if Path(child).parent != folder or Path(child).name != name:
                raise Refused(f"its group names {child!r}, outside its folder")
            if not remote_triton.valid(folder.name, name) or triton_cache.is_group(name):
                raise Refused(f"its group names {name!r}")
            names.append(name)
        if not names:
            raise Refused("its group names no file")
        return sorted(names)

    def _write_new(self, target: Path, files: dict[str, bytes]) -> bool:
        """Write the files the volume lacks (groups last); whether any was written."""
        new = False
        for name in sorted(files, key=triton_cache.is_group):
            dst = target / name
            if dst.is_file() and dst.stat().st_size == len(files[name]):
                continue
            atomic.write_bytes(dst, files[name])
            new = True
        return new

    def _publish(self, cache_key: str, files: dict[str, bytes]) -> None:
        """Every file to the remote tier, the group last; what the tier did not take is
        kept (bounded) and sent again with the next harvest."""
        if self.remote is None:
            return
        retry = list(self._unpublished.items())
        self._unpublished.clear()
        ordered = sorted(files.items(), key=lambda item: triton_cache.is_group(item[0]))
        todo = [*retry, *(((cache_key, name), data) for name, data in ordered)]
        for i, ((key, name), data) in enumerate(todo):
            if not remote_triton.publish(self.remote, key, name, data):
                for (k, n), d in todo[i:]:
                    self._unpublished[(k, n)] = d
                held = sum(map(len, self._unpublished.values()))
                while held > MAX_UNPUBLISHED_BYTES:  # the oldest go: the volume has them
                    _, dropped = self._unpublished.popitem(last=False)
                    held -= len(dropped)
                return

    # ---- Inductor -----------------------------------------------------------------------

    def _folders(
        self, status: RunStatus, fingerprint: Fingerprint, triton_env: dict[str, str]
    ) -> str:
        """The shapes the server's models learned merged into the volume's, then each
        family's watched folders saved again (``Family.harvest``) and counted by family:
        the models the run warmed (rank 0's, by their key digests) and the folders the
        manifest declares."""
        new_files = 0
        manifest = self._manifest()
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
        scope = replace(
            warm_families.scope(self.services, manifest, triton_env=triton_env, models=False),
            fingerprint=fingerprint,
            models=warmed,
            remote=self.remote,
        )
        for moved in warm_families.harvest(scope):
            if moved.anything:
                result = (
                    "failed" if moved.failed else "harvested" if moved.copied else "deduplicated"
                )
                self._count_family(moved.family, result, moved.bytes)
                new_files += moved.copied
        self._record_host(status, fingerprint)
        return "harvested" if new_files else "deduplicated"

    def _record_host(self, status: RunStatus, fingerprint: Fingerprint) -> None:
        """A host whose init container started no rank (its status has the probe, not the
        fingerprint): recorded under that probe (``registry.hosts``) once its models are
        stored, so that the next pod's init finds its full hit."""
        if status.fingerprint or not status.probe:
            return
        try:
            found = hosts.Probe.from_json(status.probe)
            told = RankHost.read(self.learned_dir)
            record = hosts.HostRecord(
                found.to_json(), fingerprint.with_kernel(""), told.triton_env if told else {}
            )
            hosts.keep_record(self.services.volume.hosts, found, record, self.remote)
        except (OSError, ValueError, RegistryError) as e:
            log.warning("harvest: this host not recorded for the next pod: %s", e)

    # ---- metrics ------------------------------------------------------------------------

    def _count(self, kind: str, result: str, size: int = 0) -> None:
        self._count_family(f"triton-{kind}s", result, size)

    def _count_family(self, family: str, result: str, size: int = 0) -> None:
        self.metrics.harvest_entries.labels(family, result).inc()
        if size and result == "harvested":
            self.metrics.harvest_bytes.labels(family).inc(size)


def _yield_the_cpu() -> None:
    """Lower this thread's CPU priority (Linux: a niceness of its own), so that where
    the sidecar shares cores with the server, the server's threads go first."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)


@contextlib.contextmanager
def _opened(folder: Path) -> Iterator[int]:
    """``folder`` opened as a directory, never through a link: its files are read at it,
    so a folder swapped for a link meanwhile cannot lead a read elsewhere."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise Refused(f"its folder is a link or gone: {e.strerror or e}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _read_at(folder: int, name: str, limit: int) -> bytes:
    """A regular file's bytes in the open ``folder``, read once (what is checked is
    what is written), refused past ``limit`` before it is read."""
    try:
        return atomic.read_bounded(Path(name), limit, dir_fd=folder)
    except ValueError as e:
        raise Refused(f"{e}; the limit left is {limit}") from None
    except OSError as e:
        raise Refused(f"{name}: {e.strerror or e}") from None


def _temporary(name: str) -> bool:
    return name.startswith((".", "tmp", atomic.TEMP_PREFIX)) or name.endswith((".tmp", ".lock"))


def _shown(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
