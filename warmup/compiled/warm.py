"""One rank's warmup of the declared compiled models.

For each model: rank 0 restores its stored Inductor artifacts (for this key and
fingerprint) into the pod's Inductor cache; on a miss it takes the fleet lock of that
key and fingerprint and looks again, so a fleet compiles (and, in ``max-autotune``,
autotunes) each model once: a pod that waited restores what the holder stored. Every
rank calls the model it built with the user's function (:func:`build_models`, once,
before the rank warms any kernel shape) once at every declared shape, with Dynamo's and
Inductor's counters read around each call; rank 0 stores what the cache holds
afterwards when anything was compiled, then lets the lock go. A lock that cannot be had
within the rank timeout (its server gone, a holder that takes too long) is passed by
with a warning: the compile is done twice, never lost. A model that has no key, cannot
be built or is not callable is failed at its build, before any kernel shape is tuned;
one that fails at a shape, then; each with a one-line reason, and the other models
still warm. Each step (the restore, the build, every shape's first call, the model's
end) is told to a ``progress`` callback as it ends (``warmup.compiled.progress``):
rank 0's run shows it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from registry.caches import inductor_cache
from registry.core.errors import LockTimeout, RegistryError, first_line
from registry.core.fingerprint import Fingerprint
from registry.locks import lock
from registry.remote import models as remote_models
from registry.remote.tier import RemoteTier
from warmup.compiled import coordesc
from warmup.compiled.counters import CompileCounts, snapshot
from warmup.compiled.inputs import grad_mode, make_inputs
from warmup.compiled.key import ModelKey, model_key
from warmup.compiled.learned import shared_dims
from warmup.compiled.package_warm import Packaged, warm_package
from warmup.compiled.progress import Kind, ModelProgress, ModelStep
from warmup.compiled.uncompiled import call_build
from warmup.core.collectives import Lockstep
from warmup.core.manifest import ModelEntry
from warmup.core.results import ModelResult
from warmup.core.services import Services

log = logging.getLogger(__name__)


def warm_models(
    models: list[ModelEntry],
    services: Services,
    *,
    rank: int,
    group: Any,
    device: Any,
    fingerprint: Fingerprint,
    remote: RemoteTier | None = None,
    progress: ModelProgress | None = None,
    built: dict[str, Built] | None = None,
) -> Iterator[ModelResult]:
    """Each model's result on this rank, in manifest order. The ranks agree after the
    build and after every shape whether all of them went on (a model failed on one rank
    is failed on every rank, and none waits for a peer that stopped); a failure inside
    the model's own collectives still costs the rank timeout. ``remote``: the registry's
    remote tier (rank 0), asked on a miss of the volume and told what rank 0 stores.
    ``progress``: told each model's steps as they end (``warmup.compiled.progress``).
    ``built``: :func:`build_models`' answer for ``models`` (built here when None); each
    model's is taken out of it as the model warms, so its callable goes with it."""
    steps = Lockstep(group, timeout_s=services.settings.run.rank_timeout_s)
    if built is None:
        built = build_models(models, services, group=group, device=device)
    for model in models:
        checked = built.pop(model.name)
        told = _Told(model, progress, checked.seconds)
        key = checked.key
        if checked.error is not None:  # failed, and logged, by its build
            result = _failed(model, checked.error, counts=checked.counts)
            digest = {"key_digest": key.digest} if key is not None else {}
            update = {**digest, "rank": rank, "seconds": told.seconds()}
            yield told.done(result.model_copy(update=update))
            continue
        assert key is not None, "a model without a key has its error"
        how = model.served_as(services.settings.models.serve)
        packaged = None
        if how != "compiled":
            packaged = warm_package(
                model, key, services, rank=rank, steps=steps, device=device,
                fingerprint=fingerprint, remote=remote,
            )  # fmt: skip
            if packaged.usable or how == "package":
                yield told.done(_served_by_package(model, key, rank, packaged, told))
                continue
            checked = _built_after_all(model, key, services, steps, device)
            if checked.error is not None:
                result = _failed(model, checked.error, counts=checked.counts)
                update = {"key_digest": key.digest, "rank": rank, "package": packaged.note}
                yield told.done(result.model_copy(update={**update, "seconds": told.seconds()}))
                continue
        if services.settings.models.on_miss == "server":
            artifacts = _Artifacts(model, key, services, fingerprint, remote)
            result = _left_to_the_server(artifacts, steps, rank, told)
            update = {"seconds": told.seconds()}
            if packaged is not None:
                update["package"] = packaged.note
            yield told.done(result.model_copy(update=update))
            continue
        with contextlib.ExitStack() as held:
            stored = _Artifacts(model, key, services, fingerprint, remote)
            restored = stored.restore_under_lock(held) if rank == 0 else None
            told.restored(restored)
            steps.barrier(what=f"model {model.name}: restore")
            learned = shared_dims(steps, services.volume.learned, model)
            result = _compile_and_run(model, checked, device, steps, learned, told)
            # any rank's compile (or a restore that was not whole) means: store again
            compiled = _compiled_on_any_rank(steps, model, result)
            whole = restored is not None and restored["restore"] == "hit"
            if rank == 0 and not result.failed and (compiled or not whole):
                result = result.model_copy(update=stored.save())
        if restored is not None:
            result = result.model_copy(update=restored)
        update = {"key_digest": key.digest, "rank": rank, "seconds": told.seconds()}
        if packaged is not None:  # auto, not packaged: compiled, and why
            update["package"] = packaged.note
        yield told.done(result.model_copy(update=update))


@dataclasses.dataclass(frozen=True)
class Built:
    """One declared model as :func:`build_models` left it: its key and the callable its
    ``build`` returned, or why it has none (``error``, the same on every rank); the
    seconds its build took, and what it compiled."""

    key: ModelKey | None
    function: Callable[..., Any] | None = None
    error: str | None = None
    seconds: float = 0.0
    counts: CompileCounts = dataclasses.field(default_factory=CompileCounts)


def build_models(
    models: list[ModelEntry], services: Services, *, group: Any, device: Any
) -> dict[str, Built]:
    """Each model's key made and its ``build`` called once, in manifest order, before
    the rank warms any kernel shape (under ``models_on_miss=server`` the key alone: the
    server builds it). A model that fails either is failed at once, on every rank (the
    ranks agree after each model), and logged with its one-line reason; the callable of
    one that builds is kept for :func:`warm_models`, which builds nothing again."""
    steps = Lockstep(group, timeout_s=services.settings.run.rank_timeout_s)
    built: dict[str, Built] = {}
    for model in models:
        key, error = _key(model)
        checked = Built(key, error=error or None)
        compiled = model.served_as(services.settings.models.serve) == "compiled"
        if key is not None and compiled and services.settings.models.on_miss != "server":
            checked = _build(model, key, device)  # a package's model is built when it is made
        if not _all_went_on(steps, checked.error, f"model {model.name}: build"):
            error = checked.error or "another rank failed it"
            log.error("model %s failed: %s", model.name, error)
            checked = dataclasses.replace(checked, function=None, error=error)
        built[model.name] = checked
    return built


def _served_by_package(
    model: ModelEntry, key: ModelKey, rank: int, packaged: Packaged, told: _Told
) -> ModelResult:
    """A model served from its package (or, ``serve: package``, failed without one):
    nothing is compiled for ``torch.compile`` here."""
    told.total = 0
    error = None if packaged.usable else f"no package: {packaged.note}"
    if error is not None:
        log.error("model %s failed: %s", model.name, error)
    return ModelResult(
        name=model.name,
        rank=rank,
        phase="packaged" if packaged.usable else "failed",
        key_digest=key.digest,
        package=packaged.note,
        error=error,
        seconds=told.seconds(),
    )


def _built_after_all(
    model: ModelEntry, key: ModelKey, services: Services, steps: Lockstep, device: Any
) -> Built:
    """``auto`` without a package: the model built for ``torch.compile`` after all (the
    ranks agree, as :func:`build_models` does; ``models_on_miss=server``: its key alone)."""
    checked = Built(key)
    if services.settings.models.on_miss == "server":
        return checked
    checked = _build(model, key, device)
    if not _all_went_on(steps, checked.error, f"model {model.name}: build"):
        error = checked.error or "another rank failed it"
        log.error("model %s failed: %s", model.name, error)
        checked = dataclasses.replace(checked, function=None, error=error)
    return checked


def _build(model: ModelEntry, key: ModelKey, device: Any) -> Built:
    """``model`` built once: its callable, or why there is none; its seconds and what it
    compiled (read around the build alone: the first read imports Dynamo)."""
    before = snapshot()
    clock = time.perf_counter()
    try:
        function = build_model(model, device)
    except ValueError as e:
        log.debug("model %s: build failed", model.name, exc_info=e)  # --debug: where
        return Built(key, None, str(e), time.perf_counter() - clock, snapshot() - before)
    return Built(key, function, None, time.perf_counter() - clock, snapshot() - before)


class _Told:
    """One model's steps as :class:`~warmup.compiled.progress.ModelStep`, told to
    ``progress`` when there is one, timed from the model's start: its build (done before
    the kernels, ``built_s``), then its turn here."""

    def __init__(self, model: ModelEntry, progress: ModelProgress | None, built_s: float) -> None:
        self.name, self.progress, self.built_s = model.name, progress, built_s
        self.began = time.perf_counter()  # the model's turn, after every kernel shape
        self.total = model.count()  # the declared shapes; the learned ones join before the first

    def seconds(self) -> float:
        """The model's seconds so far (its result's ``seconds``): its build and its turn."""
        return self.built_s + time.perf_counter() - self.began

    def restored(self, restored: dict[str, Any] | None) -> None:
        """Rank 0's restore (``None``: none on this rank), timed from the model's turn."""
        if restored is not None:
            seconds = time.perf_counter() - self.began
            self._tell("restore", seconds=seconds, what=restored["restore"])

    def built(self) -> None:
        """The user's build returned the model, in ``built_s``."""
        self._tell("build", seconds=self.built_s)

    def shape(
        self, index: int, dims: dict[str, int], seconds: float, counts: CompileCounts
    ) -> None:
        """Shape ``index`` (from 1) ran at ``dims`` in ``seconds``, compiling ``counts``."""
        compiles = counts.inductor_compiles + counts.kernel_compiles
        hits = counts.fxgraph_hits
        self._tell(
            "shape", index=index, dims=dims, seconds=seconds, compiles=compiles, cache_hits=hits
        )

    def done(self, result: ModelResult) -> ModelResult:
        """The model's end (at ``result.seconds``), told; ``result`` as it is."""
        ran, what = len(result.shapes), result.error or result.phase
        self._tell("done", elapsed=result.seconds, index=ran, what=what, failed=result.failed)
        return result

    def _tell(self, kind: Kind, **fields: Any) -> None:
        if self.progress is None:
            return
        elapsed = fields.pop("elapsed", self.seconds())
        step = ModelStep(self.name, kind, elapsed, total=self.total, **fields)
        try:
            self.progress(step)
        except Exception as e:  # a display that fails (a closed stream) costs no model
            log.warning("model progress no longer shown: %s", _one_line(e))
            self.progress = None


def _left_to_the_server(stored: _Artifacts, steps: Lockstep, rank: int, told: _Told) -> ModelResult:
    """``models_on_miss=server``: rank 0 restores the stored artifacts for the server's
    priming, and nothing is built or run here. A miss is ``deferred``: the server
    compiles it once (the fleet's first pod pays a cold server, not an init container's
    compile and then the server's load) and the sidecar's harvest stores it."""
    model = stored.model
    restored = stored.restore() if rank == 0 else None
    told.restored(restored)
    told.total = 0  # no shape runs here: the server primes them
    hit = steps.broadcast(
        restored is not None and restored["restore"].startswith("hit"),
        what=f"model {model.name}: restore",
    )
    if rank == 0 and not hit:
        log.info("model %s: left to the server's priming (%s)", model.name, restored)
    return ModelResult(
        name=model.name,
        rank=rank,
        phase="restored" if hit else "deferred",
        key_digest=stored.key.digest,
        **(restored or {}),
    )


def _key(model: ModelEntry) -> tuple[ModelKey | None, str]:
    """The model's key, or None and why it has none."""
    try:
        return model_key(model), ""
    except Exception as e:  # an unreadable source, a parent package that raises
        return None, _one_line(e)


def _compiled_on_any_rank(steps: Lockstep, model: ModelEntry, result: ModelResult) -> bool:
    """Whether any rank compiled while warming ``model``: Inductor graphs or Triton kernels."""
    compiles = result.counts.get("inductor_compiles", 0) + result.counts.get("kernel_compiles", 0)
    [most] = steps.max_over_ranks([float(compiles)], what=f"model {model.name}: compiles")
    return bool(most)


@dataclasses.dataclass(frozen=True)
class _Artifacts:
    """One model's Inductor artifacts (rank 0's business): stored under its key and the
    pod's fingerprint on the volume, and on the registry's remote tier when there is one."""

    model: ModelEntry
    key: ModelKey
    services: Services
    fingerprint: Fingerprint
    remote: RemoteTier | None

    def restore_under_lock(self, held: contextlib.ExitStack) -> dict[str, Any]:
        """The stored artifacts restored; on a miss, the fleet lock taken (the other ranks
        wait at the next barrier: within half the rank timeout, what restoring left of it)
        and a look again, for what the holder stored meanwhile."""
        started, services = time.monotonic(), self.services
        restored = self.restore()
        wait_s = min(
            services.settings.locks.timeout_s, 0.5 * services.settings.run.rank_timeout_s
        ) - (time.monotonic() - started)
        if restored["restore"].startswith("miss") and self.fleet_lock(held, wait_s):
            restored = self.restore()
        return restored

    def fleet_lock(self, held: contextlib.ExitStack, wait_s: float) -> bool:
        """Take the fleet's lock on compiling the model at this key and fingerprint (held
        until ``held`` closes); False when it could not be had in ``wait_s``: compile anyway."""
        model, services = self.model, self.services
        name = f"model:{model.name}:{self.key.digest[:16]}:{self.fingerprint.digest()[:16]}"
        if wait_s <= 0:
            log.warning(
                "model %s: compiled without the fleet lock: no time left to wait", model.name
            )
            return False
        try:
            held.enter_context(
                lock(
                    name,
                    ttl=services.settings.locks.ttl_s,
                    timeout=wait_s,
                    backend=services.locks,
                    outage_s=services.settings.locks.outage_s,
                )
            )
        except (LockTimeout, RegistryError) as e:  # unreachable server included
            log.warning("model %s: compiled without the fleet lock: %s", model.name, e)
            return False
        return True

    def restore(self) -> dict[str, Any]:
        """The volume's artifacts restored into the pod's cache; on a miss there, the remote
        tier's, fetched into the volume first."""
        model, remote, services = self.model, self.remote, self.services
        root = services.volume.inductor
        where: dict[str, Any] = {
            "model": model.name,
            "key_digest": self.key.digest,
            "fingerprint": self.fingerprint,
        }
        look = functools.partial(
            inductor_cache.restore,
            root,
            services.settings.folders.inductor_cache_dir,
            **where,
        )
        not_remote = ""  # why the remote tier did not fill the volume's miss
        try:
            done = look()
            if done.index is None and remote is not None:
                not_remote = _fetched(remote, root, where)
                done = done if not_remote else look()
        except Exception as e:  # rank 0 must reach the barrier: a bad store costs a compile
            log.warning("model %s: stored artifacts not restored: %s", model.name, _one_line(e))
            return {"restore": f"failed: {_one_line(e)}"}
        if done.index is None:  # told by the progress line and the result, not logged per look
            why = done.why_not + (f"; {not_remote}" if not_remote else "")
            return {"restore": f"miss: {why}"}
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

    def save(self) -> dict[str, Any]:
        """The pod's Inductor cache stored (then published to the remote tier); what the
        model's result says of it: nothing when storing failed."""
        model, services = self.model, self.services
        try:
            saved = inductor_cache.save(
                services.settings.folders.inductor_cache_dir,
                services.volume.inductor,
                model=model.name,
                key_digest=self.key.digest,
                key=self.key.parts,
                fingerprint=self.fingerprint,
            )
        except Exception as e:  # the pod is warm; the next one compiles again
            log.warning("model %s: artifacts not stored: %s", model.name, _one_line(e))
            return {}
        log.info(
            "model %s: stored %d artifacts (%d new, %d bytes)",
            model.name,
            saved.files,
            saved.new_blobs,
            saved.bytes,
        )
        if self.remote is not None:
            remote_models.publish(
                self.remote,
                services.volume.inductor,
                model=model.name,
                key_digest=self.key.digest,
                fingerprint=self.fingerprint,
            )
        return {"stored_artifacts": saved.files}


def _fetched(remote: RemoteTier, root: Path, where: dict[str, Any]) -> str:
    """The model's index and files fetched from the remote tier into the volume: '' when
    they came, else why not, read from the tier's counters around the fetch."""
    before = dataclasses.replace(remote.stats)
    if remote_models.fetch(remote, root, **where):
        return ""
    after = remote.stats
    if after.refused > before.refused:
        return "the remote tier's copy was refused: unsigned, or not signed by a trusted key"
    if after.errors > before.errors or after.skipped > before.skipped:
        return "the remote tier did not answer"
    return "none on the remote tier either"


def _compile_and_run(
    model: ModelEntry,
    built: Built,
    device: Any,
    steps: Lockstep,
    learned: list[dict[str, int]],
    told: _Told,
) -> ModelResult:
    """One call per shape (declared, then learned by the fleet) of the callable ``built``
    before the kernels; after each the ranks agree whether every one of them succeeded,
    so that all stop together."""
    assert built.function is not None, "a model that did not build is failed before"
    before = snapshot()
    told.built()
    shapes, skipped, error = _run_shapes(built.function, model, device, steps, learned, told)
    counts = built.counts + (snapshot() - before)
    if error is None and len(shapes) + skipped < model.count() + len(learned):
        error = "another rank failed it"
    if error is not None:
        log.error("model %s failed: %s", model.name, error)
        return _failed(model, error, shapes, counts)
    return ModelResult(name=model.name, phase="warm", shapes=shapes, counts=counts.to_json())


def _run_shapes(
    function: Callable[..., Any],
    model: ModelEntry,
    device: Any,
    steps: Lockstep,
    learned: list[dict[str, int]],
    told: _Told,
) -> tuple[list[dict[str, Any]], int, str | None]:
    """One call per shape, declared then learned, each told as it ends; the shapes that
    ran, the learned ones skipped, and the error that stopped a declared one."""
    declared = model.expand()
    told.total = len(declared) + len(learned)
    shapes: list[dict[str, Any]] = []
    skipped, error = 0, None
    for i, dims in enumerate([*declared, *learned]):
        clock, counted = time.perf_counter(), snapshot()
        try:
            run_once(function, model, dims, device)
        except Exception as e:  # the model failed at this shape; the ranks stop together
            error = f"at {dims}: {_one_line(e)}"
            log.debug("model %s failed at %s", model.name, dims, exc_info=e)  # --debug: where
        if not _all_went_on(steps, error, f"model {model.name}: {dims}"):
            if i < len(declared):
                break
            # a shape the fleet learned is a bonus: skipped on every rank, not fatal
            log.warning("model %s: learned shape %s skipped: %s", model.name, dims, error)
            error, skipped = None, skipped + 1
            continue
        seconds = time.perf_counter() - clock
        shapes.append({"dims": dims, "seconds": round(seconds, 6)})
        told.shape(i + 1, dims, seconds, snapshot() - counted)
    return shapes, skipped, error


def _all_went_on(steps: Lockstep, error: str | None, what: str) -> bool:
    """Whether no rank has failed (``error`` is this rank's)."""
    [failed] = steps.max_over_ranks([0.0 if error is None else 1.0], what=what)
    return failed == 0.0


def build_model(model: ModelEntry, device: Any) -> Callable[..., Any]:
    """The callable ``model.build(device=...)`` returns; ValueError saying why there is none."""
    coordesc.install()  # a graph this rank loads from the cache keeps its tuned kernels
    return call_build(model, device)


def run_once(
    function: Callable[..., Any], model: ModelEntry, dims: dict[str, int], device: Any
) -> Any:
    """One call at ``dims`` on fresh random inputs, finished on the device."""
    import torch  # torch loads on first use

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
    """The model failed for ``error`` (logged where it was found)."""
    return ModelResult(
        name=model.name,
        phase="failed",
        shapes=shapes or [],
        counts=(counts or CompileCounts()).to_json(),
        error=error,
    )


def _one_line(error: BaseException) -> str:
    return first_line(error)
