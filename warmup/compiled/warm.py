"""One rank's warmup of the declared compiled models.

For each model: rank 0 restores its stored Inductor artifacts (for this key and
fingerprint) into the pod's Inductor cache; on a miss it takes the fleet lock of that
key and fingerprint and looks again, so a fleet compiles (and, in ``max-autotune``,
autotunes) each model once: a pod that waited restores what the holder stored. Every
rank builds the model with the user's function and calls it once at every declared
shape, with Dynamo's and Inductor's counters read around each call; rank 0 stores what
the cache holds afterwards when anything was compiled, then lets the lock go. A lock
that cannot be had within the rank timeout (its server gone, a holder that takes too
long) is passed by with a warning: the compile is done twice, never lost. A model that
cannot be built, is not callable, or fails at a shape is failed with a one-line
reason; the other models still warm.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from registry import inductor_cache
from registry.errors import LockTimeout, RegistryError
from registry.fingerprint import Fingerprint
from registry.locks import backend_from_url, lock
from warmup.compiled.counters import CompileCounts, snapshot
from warmup.compiled.inputs import grad_mode, make_inputs
from warmup.compiled.key import ModelKey, model_key
from warmup.manifest import ModelEntry, resolve_model_builder
from warmup.results import ModelResult
from warmup.settings import Settings

log = logging.getLogger(__name__)


def warm_models(
    models: list[ModelEntry],
    settings: Settings,
    *,
    rank: int,
    group: Any,
    device: Any,
    fingerprint: Fingerprint,
) -> Iterator[ModelResult]:
    """Each model's result on this rank, in manifest order. Every rank passes the same
    barriers whatever fails, so ranks that compile collectives stay in step."""
    for model in models:
        started = time.perf_counter()
        try:
            key: ModelKey | None = model_key(model)
        except ValueError as e:
            key, error = None, str(e)
        with contextlib.ExitStack() as held:
            restored: dict[str, Any] | None = None
            if rank == 0 and key:
                restored = _restore(model, key, settings, fingerprint)
                if restored["restore"].startswith("miss") and _fleet_lock(
                    held, model, key, settings, fingerprint
                ):
                    restored = _restore(model, key, settings, fingerprint)  # stored meanwhile?
            _barrier(group)
            result = _compile_and_run(model, device) if key else _failed(model, error)
            _barrier(group)
            compiled = result.counts.get("inductor_compiles")
            if rank == 0 and key and not result.failed and compiled:
                result = result.model_copy(update=_save(model, key, settings, fingerprint))
        if restored is not None:
            result = result.model_copy(update=restored)
        yield result.model_copy(update={"rank": rank, "seconds": time.perf_counter() - started})


def _fleet_lock(
    held: contextlib.ExitStack,
    model: ModelEntry,
    key: ModelKey,
    settings: Settings,
    fingerprint: Fingerprint,
) -> bool:
    """Take the fleet's lock on compiling ``model`` at this key and fingerprint (held
    until ``held`` closes); False when it could not be had in time: compile anyway."""
    name = f"model:{model.name}:{key.digest[:16]}:{fingerprint.digest()[:16]}"
    wait_s = min(settings.lock_timeout_s, 0.8 * settings.rank_timeout_s)  # peers wait too
    try:
        held.enter_context(
            lock(
                name,
                ttl=settings.lock_ttl_s,
                timeout=wait_s,
                backend=backend_from_url(settings.lock_location),
                outage_s=settings.lock_outage_s,
            )
        )
    except (LockTimeout, RegistryError) as e:  # unreachable server included
        log.warning("model %s: compiled without the fleet lock: %s", model.name, e)
        return False
    return True


def _restore(
    model: ModelEntry, key: ModelKey, settings: Settings, fingerprint: Fingerprint
) -> dict[str, Any]:
    try:
        done = inductor_cache.restore(
            settings.paths.inductor,
            settings.inductor_cache_path,
            model=model.name,
            key_digest=key.digest,
            fingerprint=fingerprint,
        )
    except (OSError, RegistryError) as e:
        log.warning("model %s: stored artifacts not restored: %s", model.name, e)
        return {"restore": f"failed: {e}"}
    if done.index is None:
        log.info("model %s: nothing to restore: %s", model.name, done.why_not)
        return {"restore": f"miss: {done.why_not}"}
    log.info(
        "model %s: restored %d artifacts (%d already there, %d quarantined, %d missing)",
        model.name,
        done.copied,
        done.present,
        done.quarantined,
        done.missing,
    )
    broken = done.quarantined + done.missing
    return {"restore": "hit" + (f" ({broken} artifacts recompiled)" if broken else "")}


def _save(
    model: ModelEntry, key: ModelKey, settings: Settings, fingerprint: Fingerprint
) -> dict[str, Any]:
    try:
        saved = inductor_cache.save(
            settings.inductor_cache_path,
            settings.paths.inductor,
            model=model.name,
            key_digest=key.digest,
            key=key.parts,
            fingerprint=fingerprint,
        )
    except (OSError, RegistryError) as e:  # the pod is warm; the next one compiles again
        log.warning("model %s: artifacts not stored: %s", model.name, e)
        return {}
    log.info(
        "model %s: stored %d artifacts (%d new, %d bytes)",
        model.name,
        saved.files,
        saved.new_blobs,
        saved.bytes,
    )
    return {"stored_artifacts": saved.files}


def _compile_and_run(model: ModelEntry, device: Any) -> ModelResult:
    before = snapshot()
    try:
        function = build_model(model, device)
    except ValueError as e:
        return _failed(model, str(e))
    shapes: list[dict[str, Any]] = []
    for dims in model.expand():
        started = time.perf_counter()
        try:
            run_once(function, model, dims, device)
        except Exception as e:  # the model failed at this shape; the others still run
            return _failed(model, f"at {dims}: {_one_line(e)}", shapes, snapshot() - before)
        shapes.append({"dims": dims, "seconds": round(time.perf_counter() - started, 6)})
    return ModelResult(
        name=model.name, phase="warm", shapes=shapes, counts=(snapshot() - before).to_json()
    )


def build_model(model: ModelEntry, device: Any) -> Callable[..., Any]:
    """The callable ``model.build(device=...)`` returns; ValueError saying why there is none."""
    build = resolve_model_builder(model.build)
    try:
        function = build(device=device)
    except Exception as e:
        raise ValueError(f"{model.build}(device=...) raised {_one_line(e)}") from None
    if not callable(function):
        raise ValueError(
            f"{model.build}(device=...) returned {type(function).__name__}, not a callable"
        )
    return function  # type: ignore[no-any-return]


def run_once(
    function: Callable[..., Any], model: ModelEntry, dims: dict[str, int], device: Any
) -> Any:
    """One call at ``dims`` on fresh random inputs, finished on the device."""
    import torch

    inputs = make_inputs(model, dims, device)
    with grad_mode(model):
        output = function(*inputs)
    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)
    return output


def _failed(
    model: ModelEntry,
    error: str,
    shapes: list[dict[str, Any]] | None = None,
    counts: CompileCounts | None = None,
) -> ModelResult:
    log.error("model %s failed: %s", model.name, error)
    return ModelResult(
        name=model.name,
        phase="failed",
        shapes=shapes or [],
        counts=(counts or CompileCounts()).to_json(),
        error=error,
    )


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first[:300]


def _barrier(group: Any) -> None:
    if group is not None:
        import torch.distributed as dist

        dist.barrier(group=group)
