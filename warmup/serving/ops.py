"""Serving: what an inference server holds, one per process, built once from the registry.

    serving = Serving(settings)                     # one per process
    qkv = serving.op("ag_gemm", n=1536, k=8192, dtype="bf16", max_m=8192, group=tp_group)
    model = serving.model("blocks")                 # a compiled model the manifest declares
    serving.declare_warm()                          # from here a compile is counted
    y = qkv(x_shard, w_qkv)                         # [M, N]: an O(1) pick, then the kernel

``Serving()`` is an entry point: it builds the process's services once and hands its ops
their store. Each op (:mod:`warmup.serving.serving_op`) serves its layer from an
in-memory table indexed by M; a follower thread (:mod:`warmup.serving.follower`) checks
the registry every ``serving_refresh_s`` and swaps each op's new table in when this rank
may take it alone. A table that changes an M's algorithm in a collective op waits for
:meth:`Serving.sync`, a collective that every rank calls at the same point (a step
boundary), which swaps it on every rank together:

    serving.sync()                                  # every rank, between two steps

The follower also writes this process's metrics file; :meth:`Serving.declare_warm`
tells the sidecar's readiness (:mod:`warmup.serving.readiness`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import kernels
from kernels import startup
from kernels.adapter import Layer, indexed_device
from registry.core import triton_internals
from registry.core.fingerprint import detect_for, detect_in_background
from warmup.compiled.learned import Recorder, shared_dims
from warmup.core.collectives import Lockstep
from warmup.core.manifest import Manifest, ManifestError, load_manifest
from warmup.core.services import Services, existing_volume
from warmup.core.settings import Settings, from_environment, require
from warmup.serving.compile_guard import guard_from_settings
from warmup.serving.declared import declared_layers
from warmup.serving.follower import Follower, exempt
from warmup.serving.layer_reader import LayerReader
from warmup.serving.metrics import ServingMetrics
from warmup.serving.packaged import load_packaged, usable
from warmup.serving.preload import Preload, compiles_models
from warmup.serving.readiness import Readiness
from warmup.serving.serving_op import OnMissing, ServingError, ServingOp

if TYPE_CHECKING:
    from warmup.core.manifest import ModelEntry
    from warmup.serving.models import ServedModel
    from warmup.serving.packaged import ServedPackage

__all__ = ["OnMissing", "Serving", "ServingError", "ServingOp"]
log = logging.getLogger(__name__)


NO_MANIFEST = "not set: Serving() reads the manifest it names, or Settings(manifest=...)"
SERVING_VOLUME_FIX = (
    "mount the volume there or fix TRITON_WARMUP_VOLUME (Settings(volume=...)); "
    "TRITON_WARMUP_CREATE_VOLUME=true makes an empty one"
)
SERVING_WAYS = {  # how a server gives what Serving() needs: the pod's variables
    "manifest": "TRITON_WARMUP_MANIFEST (or Settings(manifest=...))",
    "volume": "TRITON_WARMUP_VOLUME (or Settings(volume=...))",
    "work_dir": "TRITON_WARMUP_WORK_DIR, the init container's (or Settings(work_dir=...))",
}


def _preload(settings: Settings) -> Preload | None:
    """The compiler's imports started now, when the manifest declares a model that will
    be served through ``torch.compile`` (not one served from its package)."""
    if settings.serving.preload and compiles_models(settings):
        return Preload(settings)
    return None


class Serving:
    """One per serving process: the registry, this machine's fingerprint, the metrics
    file, the compile guard, its readiness, and the follower of every op it made."""

    def __init__(
        self, settings: Settings | None = None, *, rank: int | None = None, follow: bool = True
    ) -> None:
        """``rank`` names this process's metrics file and label; by default its
        torch.distributed rank. Processes of one pod that share a rank (several
        engines) must pass distinct ones, or they overwrite each other's file."""
        # The pod's settings: a bad or missing variable is one line, no pydantic report, and
        # the placeholder of an unset volume (or, read from the pod, manifest) never serves.
        needs = (
            ("volume", "work_dir") if settings is not None else ("manifest", "volume", "work_dir")
        )
        self.settings = settings if settings is not None else from_environment()
        require(self.settings, needs, who="Serving()", ways=SERVING_WAYS)
        # a mistyped volume would serve from an empty store: refused, as run and serve do
        existing_volume(self.settings, fix=SERVING_VOLUME_FIX)
        self.rank = _rank() if rank is None else rank
        self.services = Services(self.settings)  # built once here: Serving() is an entry point
        self.store = self.services.store()
        self.metrics = ServingMetrics(rank=self.rank)
        self.guard = guard_from_settings(self.settings, self.metrics)  # None when "off"
        self.learned = Recorder(self.settings.paths.metrics_dir, self.rank)
        self._manifest: Manifest | None = None  # read once, when first asked
        self.follower = Follower(
            self.store,
            self.metrics,
            metrics_dir=self.settings.paths.metrics_dir,
            refresh_s=self.settings.serving.refresh_s,
            guard=self.guard,
        )
        self.readiness = Readiness(  # made: this rank is not warm until it says so again
            self.settings.paths.metrics_dir,
            self.metrics.rank,
            guard=self.guard,
            manifest=self._declared,
            flush=self.flush_metrics,
        )
        self.preload = _preload(self.settings)  # the compiler's imports, beside the server's
        _warn_if_autotune_results_are_not_cached()
        if follow:
            self.follower.start()

    @property
    def ops(self) -> list[ServingOp]:
        """The ops made so far, in the order they were made."""
        return self.follower.ops

    def op(
        self,
        kernel: str,
        *,
        n: int,
        k: int,
        dtype: str,
        max_m: int,
        group: Any = None,
        device: Any = None,
        on_missing: OnMissing = "error",
    ) -> ServingOp:
        """A serving op for one layer (a collective for a tensor-parallel kernel: every
        rank of ``group`` makes it). Raises :class:`ServingError` when the registry has
        no entry for the layer, unless ``on_missing='fallback'``."""
        device = _device(device)
        detect_in_background(device)  # the first op's detection overlaps the kernel's start
        try:
            adapter = kernels.adapter_for(kernel)
        except KeyError as e:
            raise ServingError(str(e.args[0])) from None
        if on_missing not in ("error", "fallback"):
            raise ServingError(f"on_missing={on_missing!r}; use 'error' or 'fallback'.")
        layer = Layer(n, k, dtype, max_m)
        import torch.distributed as dist  # torch loads on first use

        world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        declared = [layer]  # and the manifest's layers of this kernel: sized once for all
        with contextlib.suppress(ManifestError, OSError):  # none: this layer's size
            declared += declared_layers(self._declared(), kernel, world)
        with startup.phase("reserve"):
            adapter.reserve(declared, group=group, device=device)
        with startup.phase("serve"):  # the kernel's own start: a workspace for ag_gemm
            served = adapter.serve(layer, group=group, device=device)
        with startup.phase("fingerprint"):  # what the detection left to wait for
            fingerprint = detect_for(device, adapter.kernel_hash())
        reader = LayerReader(
            served,
            layer,
            store=self.store,
            fingerprint=fingerprint,
            match_policy=self.settings.run.match_policy,
        )
        return self.follower.keep(lambda: ServingOp(reader, on_missing=on_missing))

    def model(
        self, name: str, *, device: Any = None, prime: bool = True
    ) -> ServedModel | ServedPackage:
        """The compiled model the manifest declares as ``name``: served from its package
        (``warmup.serving.packaged``) where the model's ``serve`` allows and the pod holds
        one for it, else built by its own function on this process's device (``device``:
        default, its current GPU or the CPU) with torch.compile reading the pod's Inductor
        cache, which the warmup filled; with ``prime``, run at every declared shape until
        steady (CUDA graphs recorded), so that Dynamo's tracing (which no cache spares a
        new process) and graph recording are paid here, not by a request; whether it was restored or
        compiled, and why, is logged, counted and kept as ``primed``. Calls run under
        the model's declared mode.
        Raises :class:`ServingError` when the manifest declares no such model or it
        cannot be built or run. Once :meth:`declare_warm` is called, its compiles are
        counted."""
        manifest = self._declared()
        try:
            entry = manifest.model(name)
            learned = self._learned_shapes(entry)
            how = entry.served_as(self.settings.models.serve)
            why = ""
            if how != "compiled":
                with exempt(self.guard):
                    packaged = load_packaged(
                        entry, self.settings, device=_device(device), prime=prime, learned=learned
                    )
                if not isinstance(packaged, str):
                    self._count_prime(name, "package")
                    return packaged
                why = packaged
                if how == "package":
                    raise ServingError(f"model {name}: no usable package: {why}")
                log.warning("model %s: served through torch.compile: %s", name, why)
            from warmup.serving.models import build_served  # loads Inductor: the compiled path

            with exempt(self.guard):
                served = build_served(
                    name,
                    self.settings,
                    device=_device(device),
                    guard=self.guard,
                    prime=prime,
                    manifest=manifest,
                    recorder=self.learned,
                    learned=learned,
                    metrics=self.metrics,
                    before_prime=self._compiler_imported,
                )
            served.package_note = why
            return served
        except KeyError as e:
            raise ServingError(str(e.args[0])) from None
        except ValueError as e:
            raise ServingError(f"model {name}: {e}") from None

    def models(
        self, names: Sequence[str] | None = None, *, device: Any = None, prime: bool = True
    ) -> dict[str, ServedModel | ServedPackage]:
        """Each model of ``names`` (default: every model the manifest declares), as
        :meth:`model` serves it, by name: those with a usable package loaded side by side
        on threads (each one's weights read, package loaded and primed while the others
        are), then the others one by one (Dynamo traces one model at a time). Every rank
        calls it with the same names: the shapes the fleet learned are agreed first, in
        order, on this thread. Raises :class:`ServingError` for the first model that
        cannot be served, as :meth:`model` does."""
        manifest = self._declared()
        try:
            entries = [manifest.model(n) for n in names] if names is not None else manifest.models
        except KeyError as e:
            raise ServingError(str(e.args[0])) from None
        learned = {entry.name: self._learned_shapes(entry) for entry in entries}  # collectives
        packaged = [e for e in entries if self._has_package(e)]
        served: dict[str, ServedModel | ServedPackage] = {}
        with exempt(self.guard), ThreadPoolExecutor(max(1, len(packaged))) as pool:
            place = _device(device)
            loads = {
                e.name: pool.submit(self._load, e, place, prime, learned[e.name]) for e in packaged
            }
            for name, load in loads.items():
                try:
                    done = load.result()
                except ValueError as e:
                    raise ServingError(f"model {name}: {e}") from None
                if not isinstance(done, str):
                    self._count_prime(name, "package")
                    served[name] = done
        for entry in entries:  # in the manifest's order; a package that failed: as model()
            if entry.name not in served:
                served[entry.name] = self.model(entry.name, device=device, prime=prime)
        return {entry.name: served[entry.name] for entry in entries}

    def _load(
        self, entry: ModelEntry, device: Any, prime: bool, learned: list[dict[str, int]]
    ) -> ServedPackage | str:
        return load_packaged(entry, self.settings, device=device, prime=prime, learned=learned)

    def _has_package(self, entry: ModelEntry) -> bool:
        """Whether ``entry`` is served from a package this pod holds for it."""
        if entry.served_as(self.settings.models.serve) == "compiled":
            return False
        return not isinstance(usable(entry, self.settings), str)

    def _compiler_imported(self) -> None:
        """The compiler's imports done before a model builds: the preload's, waited for,
        or started here when no model was expected to need them."""
        if self.preload is None and self.settings.serving.preload:
            self.preload = Preload(self.settings)
        if self.preload is not None:
            self.preload.wait()

    def _count_prime(self, name: str, outcome: str) -> None:
        self.metrics.model_primes.labels(name, outcome, self.metrics.rank).inc()

    def _learned_shapes(self, entry: ModelEntry) -> list[dict[str, int]]:
        """The shapes the fleet learned for the model ``entry``, rank 0's list on every
        rank (a harvest may write the file between two ranks' reads)."""
        import torch.distributed as dist  # torch loads on first use

        group = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
        steps = Lockstep(group, timeout_s=self.settings.run.rank_timeout_s)
        return shared_dims(steps, self.services.volume.learned, entry)

    def _declared(self) -> Manifest:
        """The settings' manifest, read once (each model and ``declare_warm`` ask it);
        :class:`ManifestError` or OSError while it cannot be read."""
        if self._manifest is None:
            if not self.settings.given("manifest"):  # an op alone needs none; a model does
                raise ManifestError("TRITON_WARMUP_MANIFEST", [NO_MANIFEST])
            self._manifest = load_manifest(self.settings.paths.manifest)
        return self._manifest

    def declare_warm(self) -> None:
        """From now on every Triton compile or autotune run in this process is counted
        (``compile_guard=count``) or raises (``strict``); the sidecar's readiness is told
        this rank is warm (``ServerWarm``, with ``ready_after_server``)."""
        self.readiness.declare()

    def refresh(self) -> int:
        """Check the registry now and swap in every op's new table that this rank may
        take alone (see :meth:`ServingOp.refresh`); returns how many swapped. The
        follower calls it; a server may too. Not a collective: any rank, any time."""
        return self.follower.refresh()

    def sync(self) -> int:
        """Swap in every op's new table, algorithm changes included: each collective op
        takes rank 0's table on every rank of its group (:meth:`ServingOp.sync`). A
        collective: every rank of every collective op's group calls it at the same
        point, where the ranks are in lockstep (a step boundary), as many times as the
        others; each collective op agrees once per call, in the order the ops were made,
        whether anything changed or not. Other ops just refresh. Returns how many ops
        swapped."""
        return self.follower.sync()

    def flush_metrics(self) -> None:
        """Export the ops' call counts and pending tables, and write this process's
        metrics file."""
        self.follower.flush_metrics()

    def close(self) -> None:
        """Stop the follower, write the metrics a last time, disarm the guard; this rank
        is no longer warm."""
        self.readiness.withdraw()
        self.follower.stop()
        self.flush_metrics()
        if self.guard is not None:
            self.guard.disarm()

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rank() -> int:
    import torch.distributed as dist  # torch loads on first use

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    log.info("torch.distributed is not initialised: this process's serving metrics are rank 0")
    return 0


def _device(device: Any) -> Any:
    import torch  # torch loads on first use

    if device is not None:
        return indexed_device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _warn_if_autotune_results_are_not_cached() -> None:
    """Without Triton's autotune-result caching, a user's ``@triton.autotune`` kernels
    benchmark again in this process although the warmup stored their choices."""
    if triton_internals.autotune_results_cached() is False:
        log.warning(
            "TRITON_CACHE_AUTOTUNING is not set: @triton.autotune kernels will re-tune in "
            "this server; set TRITON_CACHE_AUTOTUNING=1 before Triton is imported"
        )
