"""The init container does only what the server cannot: on a full hit, restore and exit.

When every kernel shape the manifest declares for this pod's world size is stored for
this host's fingerprint, and every declared model's Inductor artifacts are, there is
nothing for rank processes to do that the server will not do anyway: the server's
priming (``Serving.op``, ``Serving.model``) loads the same configs and artifacts. So
``triton-warmup run`` then restores the caches, writes a ready status and exits, without
importing torch or Triton: the host's fingerprint is the one a warm run recorded for a
host with the same probe (``registry.storage.hosts``), read in milliseconds.

Anything that misses (a shape never tuned here, a model not stored, a host never seen,
another kernel source) runs the full warm in rank processes, which records the host for
the next pod. The server proves every hit: what its priming compiles anyway is counted
and logged (``warmup.serving``). ``TRITON_WARMUP_FULL_HIT_EXIT=false`` turns this off.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kernels import ADAPTERS
from registry import families as registry_families
from registry.core.errors import RegistryError, named
from registry.core.fingerprint import Fingerprint
from registry.families import Declared, Scope
from registry.remote.tier import RemoteTier
from registry.remote.tiered import TieredStore
from registry.storage import hosts
from registry.storage.hosts import HostRecord, Probe
from warmup.caches import families
from warmup.compiled.key import ModelKey, model_key, module_source
from warmup.compiled.package_files import PACKAGE
from warmup.core.manifest import Manifest, ModelEntry
from warmup.core.results import ModelResult, RunStatus, ShapeResult
from warmup.core.services import Services
from warmup.run.aggregate import RunRecord, Saved, Tally, ended, write_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FullHit:
    """Everything the manifest declares for this pod, found stored for this host."""

    record: HostRecord
    shapes: list[ShapeResult]
    models: list[tuple[ModelEntry, ModelKey]] = field(default_factory=list)


def look(
    services: Services,
    manifest: Manifest,
    world: int,
    found: Probe,
    remote: RemoteTier | None = None,
) -> FullHit | str:
    """A :class:`FullHit` for this host (``found``), or one line saying what misses.
    ``remote``: the registry's remote tier, asked when the volume misses (a pod on a node
    without the fleet's volume): its record of such hosts, then what the volume lacks of
    the shapes and models that record names, fetched into the volume (and the record
    kept there: what is not a hit is left to the server or warmed). Never raises: what
    cannot be read is a miss, and the full warm runs."""
    try:
        return _looked(services, manifest, world, found, remote)
    except Exception as e:  # a shortcut, never an authority
        return f"the stored state could not be read ({named(e)})"


def _looked(
    services: Services, manifest: Manifest, world: int, found: Probe, remote: RemoteTier | None
) -> FullHit | str:
    try:
        record = hosts.read_record(services.volume.hosts, found)
    except RegistryError as e:
        return f"the host record is unusable: {e}"
    if record is None and remote is not None:
        record = hosts.fetch_record(remote, found)
        if record is not None and not record.ambiguous:  # kept: what misses is warmed
            hosts.write_record(services.volume.hosts, found, record)
    if record is None:
        return "no warm run has recorded a host with this software, GPUs, driver and kernels"
    if record.ambiguous:
        return (
            "hosts with this probe detected different fingerprints (a GPU topology, a MIG "
            "profile or a tool it cannot see): its fingerprint must be detected"
        )
    shapes = _stored_shapes(services, manifest, world, record, remote)
    if isinstance(shapes, str):
        return shapes
    models = _stored_models(services, manifest.models_for(world), record, remote)
    if isinstance(models, str):
        return models
    return FullHit(record, shapes, models)


def _stored_shapes(
    services: Services,
    manifest: Manifest,
    world: int,
    record: HostRecord,
    remote: RemoteTier | None,
) -> list[ShapeResult] | str:
    """Each declared kernel shape as the store holds it for the recorded fingerprint: the
    volume's, else the remote tier's (filed in the volume: ``TieredStore``)."""
    store, shapes = TieredStore(services.store(), remote), []
    for entry in manifest.entries_for(world):
        for shape in entry.expand():
            item = record.items.get(hosts.item_id(entry.kernel, entry.dtype, world, shape))
            where = f"{entry.kernel} {entry.dtype} " + " ".join(
                f"{k}={v}" for k, v in shape.items()
            )
            if item is None:
                return f"{where} was never warmed on a host like this one"
            key = dict(item["key"])
            if entry.kernel not in ADAPTERS:  # a user function: its kernels are in the cache
                source = user_source(entry.kernel)
                if not source or item.get("source") != source:
                    return f"{where}: its function's module changed since it was warmed"
                shapes.append(ShapeResult(kernel=entry.kernel, key=key, source="user"))
                continue
            kernel_hash = record.kernel_hashes.get(entry.kernel, "")
            fingerprint = record.fingerprint.with_kernel(kernel_hash)
            stored = store.lookup(
                entry.kernel, key, fingerprint, services.settings.run.match_policy
            )
            if stored is None:
                return f"{where} is not stored for this host's fingerprint"
            config = stored.best.to_json()
            shapes.append(
                ShapeResult(kernel=entry.kernel, key=key, source="registry", config=config)
            )
    return shapes


def _stored_models(
    services: Services, models: list[ModelEntry], record: HostRecord, remote: RemoteTier | None
) -> list[tuple[ModelEntry, ModelKey]] | str:
    """Each declared model with its key, when its artifacts are stored for this host:
    on the volume, else on the remote tier (fetched into the volume)."""
    found = []
    here = families.scope(services, None, fingerprint=record.fingerprint, models=False)
    here = replace(here, remote=remote)
    default = services.settings.models.serve
    for model in models:
        try:
            key = model_key(model)
        except ValueError as e:
            return f"model {model.name} has no key: {e}"
        item = Declared(model.name, key.digest)
        how = model.served_as(default)
        if how != "compiled":
            package = _stored_package(here, item)
            if package is None:
                return f"model {model.name} has no package stored for this host's fingerprint"
            if package or how == "package":  # served from it, or failed without one
                found.append((model, key))
                continue
        if not registry_families.models().fetch(here, item):
            return f"model {model.name} is not stored for this host's fingerprint"
        found.append((model, key))
    return found


def _stored_package(here: Scope, item: Declared) -> bool | None:
    """Whether the package stored for ``item`` is one (True) or the record of why the
    model has none (False); None when nothing is stored (fetched from the remote tier
    into the volume first)."""
    family = registry_families.package_family()
    if not family.fetch(here, item):
        return None
    return family.stored_files(here, item).get(PACKAGE) is not None


def restore_and_finish(
    services: Services,
    manifest: Manifest,
    world: int,
    hit: FullHit,
    *,
    started: float,
    phases: Mapping[str, float],
) -> RunStatus:
    """The volume restored into this pod (registry recovery, Triton's cache, each model's
    artifacts), the run's metrics and a ready status written; the status."""
    fingerprint = hit.record.fingerprint
    return _finish(
        services, manifest, world, hit.record,
        lambda: [_restored(services, fingerprint, model, key) for model, key in hit.models],
        started=started, phases=phases, shapes=hit.shapes, full_hit=True,
    )  # fmt: skip


def _finish(
    services: Services,
    manifest: Manifest,
    world: int,
    host: HostRecord | None,
    models_of: Callable[[], list[ModelResult]],
    *,
    started: float,
    phases: Mapping[str, float],
    shapes: Sequence[ShapeResult] = (),
    **fields: Any,
) -> RunStatus:
    """A run that started no rank: the volume restored into this pod (the registry's
    recovery, every cache family, then ``models_of``'s), its metrics and its status written
    (ready unless a model failed; the host record's fingerprint, when there is one)."""
    from warmup.run.restore import restore  # the registry's recovery and the families

    restoring = time.perf_counter()
    recovered = restore(services, manifest, host=host.fingerprint if host else None)
    models = models_of()
    record = RunRecord(
        services=services,
        manifest=manifest,
        world=world,
        started=started,
        phases={**phases, "restore": time.perf_counter() - restoring},
        recovered=recovered,
    )
    tally = Tally(shapes=list(shapes), models=models, skipped=manifest.skipped_entries(world))
    duration = time.time() - started
    write_metrics(record, tally, duration, dict(record.phases))
    facts = Saved(
        fingerprint=host.fingerprint.to_json() if host else None,
        triton_env=dict(host.triton_env) if host else {},
    )
    return ended(record, tally, facts, duration=duration, phases=record.phases, **fields)


def _restored(
    services: Services, fingerprint: Fingerprint, model: ModelEntry, key: ModelKey
) -> ModelResult:
    """One model's artifacts copied into the pod's Inductor cache (the models' family's
    restore); a part that could not be is compiled by the server, which says so."""
    scope = families.scope(services, None, fingerprint=fingerprint)
    item = Declared(model.name, key.digest)
    package = ""
    if model.served_as(services.settings.models.serve) != "compiled":
        packaged = registry_families.package_family().restore_one(scope, item)
        package = "restored" if packaged.hit else packaged.outcome
        if packaged.hit and _stored_package(scope, item):  # the server needs no Inductor cache
            return ModelResult(
                name=model.name, phase="packaged", seconds=packaged.seconds,
                key_digest=key.digest, package=package,
            )  # fmt: skip
    done = registry_families.models().restore_one(scope, item)
    return ModelResult(
        name=model.name,
        phase="restored",
        seconds=done.seconds,
        restore=done.outcome,
        key_digest=key.digest,
        package=package,
    )


def nothing_for_ranks(services: Services, manifest: Manifest, world: int) -> bool:
    """Whether rank processes have nothing to do that the server will not: no kernel
    shape to tune or check, and the models left to the server's priming
    (``models_on_miss=server``). A manifest of declared folders alone has none: the
    server writes them, the harvest keeps them."""
    if not manifest.entries_for(world) and not manifest.models_for(world):
        return True
    if services.settings.models.on_miss != "server" or manifest.entries_for(world):
        return False
    default = services.settings.models.serve  # a package is made in a rank
    return all(m.served_as(default) == "compiled" for m in manifest.models_for(world))


def leave_to_the_server(
    services: Services,
    manifest: Manifest,
    world: int,
    found: Probe,
    *,
    started: float,
    phases: Mapping[str, float],
) -> RunStatus:
    """Models only, and not all stored for this host: what is stored is restored (when
    a warm run recorded such a host), the rest left to the server, which compiles it
    once (the fleet's first pod: no rank, no torch here). The status carries the probe:
    the server tells its fingerprint (``warmup.serving.models``) and the harvest records
    the host under it, so that the next pod's init is a full hit."""
    try:
        record = hosts.read_record(services.volume.hosts, found)
    except RegistryError:
        record = None
    if (record is None or record.ambiguous) and not manifest.models_for(world):
        record = detected_record(services, found)  # an ambiguous one names another host
    return _finish(
        services, manifest, world, record,
        lambda: [_model_for_the_server(services, record, m) for m in manifest.models_for(world)],
        started=started, phases=phases, probe=found.to_json(),
    )  # fmt: skip


def detected_record(services: Services, found: Probe) -> HostRecord | None:
    """A pod of declared folders alone (an engine's caches: no kernel shape, no model) on a
    host never recorded: its fingerprint detected here (torch and Triton imported, once
    per kind of host) and recorded under the probe, so that the harvest stores the
    folders the server writes under it and the next pod's init restores them with no
    import. A host it cannot detect stays unrecorded: the server still runs, cold."""
    from warmup.caches.explain import detect_host  # torch and Triton: once per kind of host

    try:
        host = detect_host(services.settings)
        record = HostRecord(found.to_json(), host.fingerprint.with_kernel(""), host.triton.env)
        hosts.keep_record(services.volume.hosts, found, record, services.remote)
    except Exception as e:  # the pod serves anyway; the next one tries again
        log.warning("this host not detected, its folders not kept for the next pod: %s", named(e))
        return None
    log.info("host detected and recorded for the declared folders: %s", record.fingerprint)
    return record


def _model_for_the_server(
    services: Services, record: HostRecord | None, model: ModelEntry
) -> ModelResult:
    """The model restored when such a host stored it, else deferred to the server."""
    try:
        key = model_key(model)
    except ValueError as e:
        return ModelResult(name=model.name, phase="failed", error=str(e))
    if record is not None:
        restored = _restored(services, record.fingerprint, model, key)
        if restored.restore.startswith("hit"):
            return restored
    log.info("model %s: left to the server's priming (nothing stored for this host)", model.name)
    return ModelResult(
        name=model.name,
        phase="deferred",
        restore="miss: nothing stored for this host",
        key_digest=key.digest,
    )


def record_host(
    services: Services, manifest: Manifest, world: int, found: Probe, status: RunStatus
) -> None:
    """After a ready full run: what it detected and stored, recorded for hosts like this
    one (``registry.storage.hosts``) on the volume and on the remote tier, so that the next
    pod's init can find its full hit. A failure costs the next pod a full run, never
    this one."""
    try:
        record = _record_of(manifest, world, found, status)
        if record is None:
            return
        hosts.keep_record(services.volume.hosts, found, record, services.remote)
    except Exception as e:  # the pod is warm
        log.warning("host record not written: %s", named(e))


def _record_of(
    manifest: Manifest, world: int, found: Probe, status: RunStatus
) -> HostRecord | None:
    """The record of a ready status: rank 0's shapes paired with the declared shapes,
    in manifest order (the report's order); None when they do not pair."""
    if not status.ready or status.fingerprint is None:
        return None
    declared = [
        (entry.kernel, entry.dtype, world, shape)
        for entry in manifest.entries_for(world)
        for shape in entry.expand()
    ]
    ranked = [shape for shape in status.shapes if shape.rank == 0]
    kernels = [item[0] for item in declared]
    if [s.kernel for s in ranked] != kernels or any(s.failed for s in ranked):
        log.warning("host record not written: rank 0 reported other shapes than declared")
        return None
    from warmup.caches.explain import kernel_hashes  # imports the kernels: the launcher did already

    paired = [(*item, result.key) for item, result in zip(declared, ranked, strict=True)]
    items = hosts.items_of(paired)
    for item in items.values():  # a user function's kernels: as its module's source was
        if item["kernel"] not in ADAPTERS:
            item["source"] = user_source(item["kernel"])
    return HostRecord(
        probe=found.to_json(),
        fingerprint=_without_kernel(status.fingerprint),
        triton_env=status.triton_env,
        kernel_hashes=kernel_hashes(manifest),
        items=items,
    )


def user_source(function: str) -> str:
    """A digest of the source of a user function's module (``module:function``), read
    without importing it; "" when it cannot be read (then it is never a full hit)."""
    try:
        return hashlib.sha256(module_source(function.partition(":")[0]).encode()).hexdigest()
    except ValueError:
        return ""


def _without_kernel(data: Mapping[str, Any]) -> Fingerprint:
    return Fingerprint.from_json(data).with_kernel("")
