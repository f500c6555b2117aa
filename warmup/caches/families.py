"""The cache families driven for one pod: the scope a manifest and the settings give
them, and the loops (restore, save, explain) over every family of
:mod:`registry.families`, which name none.

A loop never stops at one family's failure: it is logged and noted, and the others go
on (a family that cannot be restored costs a compile, never the warm).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from registry import families
from registry.core.errors import named
from registry.core.explain import Prediction, predict
from registry.core.fingerprint import Fingerprint
from registry.families import Declared, Family, Host, Moved, Scope, Sources
from registry.families.engine_key import RECORD, EngineKey, EngineKeySpec
from registry.remote.tier import RemoteTier
from warmup.compiled.key import model_key
from warmup.core.manifest import Manifest
from warmup.core.services import Services

log = logging.getLogger(__name__)


def scope(
    services: Services,
    manifest: Manifest | None,
    *,
    world: int | None = None,
    fingerprint: Fingerprint | None = None,
    triton_env: Mapping[str, str] | None = None,
    models: bool = True,
    env: Mapping[str, str] | None = None,
    engine_keys: Mapping[str, Mapping[str, Any]] | None = None,
) -> Scope:
    """Where the families work for this pod: the services' folders, what ``manifest``
    declares (for ``world`` ranks, if given), and the host of ``fingerprint`` if known
    (then also the registry's remote tier, for the declared folders to fetch and publish).
    ``models``: False where the declared models are restored by their own warm (their
    keys read from their sources are not needed). ``env``: the environment the declared
    folders' engine keys are read from (this process's, read here once, by default);
    ``engine_keys``: facts already read elsewhere, by folder name (:func:`engine_keys`),
    taken over ``env``'s."""
    folders, settings = declared_folders(manifest, env, engine_keys), services.settings
    return Scope(
        volume=services.volume,
        pod=settings.folders.by_name(),
        store=services.store,
        match_policy=settings.run.match_policy,
        models=declared_models(manifest, world) if models else (),
        folders=folders,
        user_functions=manifest is not None and any(e.is_user_function for e in manifest.entries),
        fingerprint=fingerprint,
        triton_env=triton_env,
        remote=_remote(services) if fingerprint is not None and folders else None,
    )


def _remote(services: Services) -> RemoteTier | None:
    """The remote tier, or None when it is off or its URL is unusable (the run's checks
    refuse such a URL before any rank starts; here it only costs the sharing)."""
    return services.remote_or_none("declared folders: the remote tier is not used")


def declared_models(manifest: Manifest | None, world: int | None = None) -> tuple[Declared, ...]:
    """Each declared model with its key (``warmup.compiled.key``); one whose key cannot be
    made carries the reason."""
    if manifest is None:
        return ()

    found = []
    models = manifest.models if world is None else manifest.models_for(world)
    for model in models:
        try:
            key = model_key(model)
        except ValueError as e:
            found.append(Declared(model.name, "", error=f"it has no key: {e}"))
            continue
        found.append(Declared(model.name, key.digest, key.parts))
    return tuple(found)


def declared_folders(
    manifest: Manifest | None,
    env: Mapping[str, str] | None = None,
    known: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[Declared, ...]:
    """Each folder of the manifest's ``caches:``, keyed by its name and declared key,
    with the engine-key facts of this pod (``registry.families.engine_key``, from ``env``,
    this process's environment by default): recorded when it is saved, compared when it
    is restored or explained; a folder's facts in ``known`` (the init container's, read
    from its status by the sidecar) are taken as they are. The facts never enter the key
    digest."""
    if manifest is None:
        return ()
    env = os.environ if env is None else env  # the entry point's environment, read once here
    found = []
    for c in manifest.caches:
        spec = EngineKeySpec.of(c.engine, c.key_env, c.key_paths)
        given = (known or {}).get(c.name)
        facts = dict(given) if given is not None else EngineKey.here(spec, c.path, env).to_json()
        key = {"key": c.key, RECORD: facts}
        found.append(Declared(c.name, folder_key_digest(c.name, c.key), key, folder=c.path))
    return tuple(found)


def engine_keys(manifest: Manifest | None) -> dict[str, dict[str, Any]]:
    """Each declared folder's engine-key facts in this process's environment, by name:
    what the init container writes into its status for the sidecar's harvest."""
    return {d.name: dict(d.key[RECORD]) for d in declared_folders(manifest)}


def folder_key_digest(name: str, key: str) -> str:
    """The digest a declared folder's files are stored under (no path enters it)."""
    text = json.dumps({"name": name, "key": key}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def restore(where: Scope, *, needing_host: bool | None = None) -> list[Moved]:
    """Every family's restore into this pod, each logged in one line. ``needing_host``:
    only the families that need (True) or do not need (False) the host's fingerprint."""
    chosen = [f for f in families.every() if needing_host in (None, f.needs_host)]
    return [_step(family, "restore", where) for family in chosen]


def save(where: Scope) -> list[Moved]:
    """Every family's save onto the volume, each logged in one line."""
    return [_step(family, "save", where) for family in families.every()]


def _step(family: Family, step: str, where: Scope) -> Moved:
    try:
        moved: Moved = getattr(family, step)(where.only(family))
    except Exception as e:  # one family's failure never stops the others
        why = f"{step} failed: {named(e)}"
        log.warning("%s: %s", family.name, why)
        return Moved(family.name, notes=[why], failed=why)
    if moved.anything:
        log.info("%s", moved.line(_PAST[step]))
    return moved


_PAST = {"restore": "restored", "save": "saved", "harvest": "harvested"}


def harvest(where: Scope) -> list[Moved]:
    """After ready, every family's harvest of its watched folders, each logged."""
    return [_step(family, "harvest", where) for family in families.every()]


def failures(moved: list[Moved]) -> list[str]:
    """What a loop's failed steps say, each naming its family (a run's errors)."""
    return [f"{m.family}: {m.failed}" for m in moved if m.failed]


def explain(where: Scope, host: Host, sources: Sources) -> list[Prediction]:
    """One prediction per family, in the families' order; a family whose comparison
    fails predicts nothing and says why."""
    predictions = []
    for family in families.every():
        try:
            predictions.append(family.explain(where.only(family), host, sources))
        except Exception as e:
            log.warning("explain: %s failed: %s", family.name, named(e))
            predictions.append(predict(family.name, [], note=f"not predicted: {named(e)}"))
    return predictions


def names() -> list[str]:
    """The families' names, in their order (metrics labels, ``explain``'s lines)."""
    return [family.name for family in families.every()]
