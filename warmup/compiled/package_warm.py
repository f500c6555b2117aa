"""One rank's part in a declared model's package (``warmup.compiled.package``).

Rank 0 restores the package stored for the model's key and this host (the volume, else
the remote tier) into the pod's package folder. On a miss it takes the fleet lock of that
package and looks again, so a fleet exports and compiles each model once: a pod that
waited restores what the holder stored. Still missing, it makes the package (or the
record of why there is none) and stores it, which publishes it. Every rank is then told
whether the package is usable: the model is served from it, or (``auto``) warmed for
``torch.compile`` as before, with the reason kept.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from dataclasses import dataclass
from typing import Any

from registry import families as registry_families
from registry.core.errors import LockTimeout, RegistryError, named
from registry.core.fingerprint import Fingerprint
from registry.families import Declared, Scope
from registry.families.keyed import KeyedFolders
from registry.locks import lock
from registry.remote.tier import RemoteTier
from warmup.compiled import package_files
from warmup.compiled.key import ModelKey
from warmup.compiled.package import make_package
from warmup.compiled.package_files import PackageFailed, PackageInfo
from warmup.core.collectives import Lockstep
from warmup.core.manifest import ModelEntry
from warmup.core.services import Services

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Packaged:
    """What became of a model's package on this pod: ``usable`` or not, and one line
    (``restored``, ``made in 31.2 s``, ``failed (export): ...``) for its result."""

    usable: bool
    note: str
    seconds: float = 0.0


def warm_package(
    model: ModelEntry,
    key: ModelKey,
    services: Services,
    *,
    rank: int,
    steps: Lockstep,
    device: Any,
    fingerprint: Fingerprint,
    remote: RemoteTier | None,
) -> Packaged:
    """The model's package restored or made by rank 0, the outcome on every rank."""
    clock = time.perf_counter()
    done = _on_rank_0(model, key, services, device, fingerprint, remote) if rank == 0 else None
    usable, note = steps.broadcast(
        [done.usable, done.note] if done is not None else None, what=f"model {model.name}: package"
    )
    return Packaged(bool(usable), str(note), time.perf_counter() - clock)


def _on_rank_0(
    model: ModelEntry,
    key: ModelKey,
    services: Services,
    device: Any,
    fingerprint: Fingerprint,
    remote: RemoteTier | None,
) -> Packaged:
    family = registry_families.package_family()
    item = Declared(model.name, key.digest, key.parts)
    scope = Scope(
        volume=services.volume,
        pod=services.settings.folders.by_name(),
        store=services.store,
        models=(item,),
        fingerprint=fingerprint,
        remote=remote,
    ).only(family)
    folder = family.folder(scope, item)
    found = _restored(family, scope, item)
    if found is None:
        with contextlib.ExitStack() as held:
            if _fleet_lock(held, services, model, key, fingerprint):
                found = _restored(family, scope, item)
            if found is None:
                shutil.rmtree(folder, ignore_errors=True)  # a stale or partial package
                made = make_package(model, key.digest, device, folder)
                _store(family, scope)
                return _outcome(made, "made")
    return _outcome(found, "restored")


def _restored(
    family: KeyedFolders, scope: Scope, item: Declared
) -> PackageInfo | PackageFailed | None:
    """The stored package (or failure) for ``item``, restored into its folder; None on a miss."""
    done = family.restore_one(scope, item)
    return package_files.read(family.folder(scope, item)) if done.hit else None


def _store(family: KeyedFolders, scope: Scope) -> None:
    """The package folder stored on the volume and published; a failure costs the next
    pod an export, never this one its warm."""
    moved = family.save(scope)
    for note in moved.notes:
        log.warning("model package: %s", note)


def _outcome(found: PackageInfo | PackageFailed, how: str) -> Packaged:
    if isinstance(found, PackageFailed):
        return Packaged(False, f"failed ({found.stage}): {found.reason}")
    took = found.export_s + found.compile_s
    return Packaged(True, f"{how} in {took:.1f} s" if how == "made" else how)


def _fleet_lock(
    held: contextlib.ExitStack,
    services: Services,
    model: ModelEntry,
    key: ModelKey,
    fingerprint: Fingerprint,
) -> bool:
    """The fleet's lock on making this package (held until ``held`` closes); False when
    it could not be had: made anyway (a duplicate package is harmless, a lost one is not)."""
    settings = services.settings
    name = f"package:{model.name}:{key.digest[:16]}:{fingerprint.digest()[:16]}"
    wait_s = min(settings.locks.timeout_s, 0.5 * settings.run.rank_timeout_s)
    try:
        held.enter_context(
            lock(
                name,
                ttl=settings.locks.ttl_s,
                timeout=wait_s,
                backend=services.locks,
                outage_s=settings.locks.outage_s,
            )
        )
    except (LockTimeout, RegistryError) as e:  # an unreachable lock server included
        log.warning("model %s: packaged without the fleet lock: %s", model.name, named(e))
        return False
    return True
