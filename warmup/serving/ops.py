"""Serving ops: what an inference server holds per layer, built once from the registry.

    serving = Serving(settings)                     # one per process
    qkv = serving.op("ag_gemm", n=1536, k=8192, dtype="bf16", max_m=8192, group=tp_group)
    model = serving.model("blocks")                 # a compiled model the manifest declares
    serving.declare_warm()                          # from here a compile is counted
    y = qkv(x_shard, w_qkv)                         # [M, N]: an O(1) pick, then the kernel

A serving op loads every registry entry of its layer (kernel, N, K, dtype, world; the
fingerprint matched by the settings' policy) into a table indexed by M, so a call picks
its config with one list index: no disk, no tuning, no compile on the request path.
Making an op is a collective for a tensor-parallel kernel (every rank makes it), and
ends with real calls at the smallest M, one per config, so a first request costs what
a steady one does.
An M with no entry of its own takes the nearest tuned M's config (log distance, the
tuner's fallback rule; a tie goes to the larger M). Every config of the table is built
(compiled or loaded, GPU module loaded) when the table is made.

A follower thread checks the registry every ``serving_refresh_s``; a new generation (a
hot-reloaded bundle, another pod's tuning) builds a new table off the request path and
swaps it in with one assignment. Each rank's follower swaps on its own, so a swap must be
safe whichever call each rank takes it at: every call of a tensor-parallel op is a
collective, and every rank must run the same algorithm at each call. A new table that
changes block shapes only swaps at once; one that changes an M's algorithm in a
collective op is built and kept pending until :meth:`Serving.sync`, a collective that
every rank calls at the same point (a step boundary), swaps it on every rank together:

    serving.sync()                                  # every rank, between two steps

The follower also writes this process's metrics file.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import kernels
from kernels.adapter import BUCKET_FIELD, Layer, Served, indexed_device
from registry import KernelConfig, Store
from registry.core import triton_internals
from registry.core.fingerprint import Fingerprint, detect_for
from registry.storage import keys
from warmup.compiled.learned import Recorder, shared_dims
from warmup.core.collectives import Lockstep
from warmup.core.manifest import Manifest, ManifestError, load_manifest
from warmup.core.results import ServerWarm
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.serving.compile_guard import guard_from_settings
from warmup.serving.metrics import ServingMetrics
from warmup.serving.preload import Preload, declares_models
from warmup.serving.table import FALLBACK, SOURCES, Table, nearest_table, rehearsal

if TYPE_CHECKING:
    from warmup.core.manifest import ModelEntry
    from warmup.serving.models import ServedModel

log = logging.getLogger(__name__)
OnMissing = Literal["error", "fallback"]
METRICS_EVERY_S = 10.0  # how often the follower rewrites the metrics file


class ServingError(ValueError):
    """A serving op cannot be made: no tuned entry for the layer, or bad arguments."""


class ServingOp:
    """One layer's kernel with a config per call; see the module docstring. Made by
    :meth:`Serving.op`. Call it with the kernel's inputs: ``op(a_shard, b, out=None)``."""

    def __init__(
        self,
        served: Served,
        layer: Layer,
        *,
        store: Store,
        fingerprint: Fingerprint,
        settings: Settings,
        on_missing: OnMissing,
    ) -> None:
        self.served, self.layer, self.kernel = served, layer, served.kernel
        self.step = served.rows_step
        self.on_missing = on_missing
        self._store, self._fingerprint, self._settings = store, fingerprint, settings
        self.calls = [0, 0, 0]  # by source; the follower exports them
        self.version: tuple[object, ...] = ()  # the registry version the table was built from
        self.pending: Table | None = None  # built, waiting for Serving.sync(): see refresh()
        self._pending_tuned: dict[int, KernelConfig] | None = None
        self._rejected: dict[int, KernelConfig] | None = None  # an agreed table that failed
        self._prepared: dict[KernelConfig, set[int]] = {}  # config -> the Ms it was built for
        # Every rank takes rank 0's table: the same error, the same rehearsal collectives.
        self.tuned = self._read_agreed()[1]  # M -> config: what the table is made of
        self.table = self._table(self.tuned)
        if not self.table.buckets and on_missing == "error":
            raise ServingError(self._no_entries())
        self._prepare(self.table)
        served.rehearse(rehearsal(self.table))  # every rank makes its ops together

    @property
    def collective(self) -> bool:
        """Every rank must take an algorithm change together (a tensor-parallel op)."""
        return bool(self.served.collective)

    def __call__(self, *inputs: Any, out: Any = None) -> Any:
        table = self.table  # one read: a swap between calls never splits a call
        m = self.served.rows(*inputs)
        index = m // self.step
        if not 0 < index < len(table.pick):
            raise ValueError(
                f"{self.kernel}: a call of M={m} rows; this op serves 1..{self.layer.max_m}."
            )
        self.calls[table.source[index]] += 1
        return self.served(table.configs[table.pick[index]], *inputs, out=out)

    def in_graph(self) -> Any:
        """This op as a callable ``(a, b) -> out`` for a ``torch.compile``d model's
        forward: a registered custom op, opaque to Dynamo (no graph break, no trace into
        the kernel); see :mod:`warmup.serving.in_graph`."""
        from warmup.serving.in_graph import in_graph  # registers torch custom ops

        return in_graph(self)

    def config_for(self, m: int) -> KernelConfig:
        """The config a call of ``m`` rows runs with."""
        if not 0 < m <= self.layer.max_m or m % self.step:
            raise ValueError(
                f"{self.kernel}: M={m} is not a multiple of {self.step} in 1..{self.layer.max_m}."
            )
        return self.table.config_for(m // self.step)

    def refresh(self) -> bool:
        """Rebuild from the registry as it is now and swap the table in if it changed and
        the swap is safe on this rank alone; builds new configs first. Called by the
        follower, never by a request. Each rank swaps on its own, at whichever call it
        sees the generation, so a swap must not change what the ranks run together: a
        collective op swaps only a table whose every M keeps its algorithm (block shapes
        change, the ranks compute the same result). A table that changes an M's algorithm
        is built and kept in :attr:`pending` (warned once) until :meth:`sync`."""
        tuned = self._read()
        if tuned == self.tuned:
            self._set_pending(None, None)  # the registry is back at this table
            return False
        if not tuned:
            self._warn_empty()
            return False
        if tuned == self._pending_tuned:
            return False  # built already, waiting for a sync
        new = self._built(tuned)
        changed = self._algorithm_changes(new) if self.collective else []
        if changed:
            self._set_pending(new, tuned)
            log.warning(
                "%s %s: the registry's new table changes the algorithm at %d Ms (M %d..%d); "
                "ranks must take it together, so it waits, built: call serving.sync() on "
                "every rank at a step boundary",
                *(self.kernel, self.layer, len(changed), changed[0], changed[-1]),
            )
            return False
        self._swap(new, tuned)
        return True

    def sync(self) -> bool:
        """Take rank 0's table on every rank of the group and swap it in, algorithm
        changes included; a collective: every rank calls it at the same point. It makes
        two collectives per call, whether anything changed or not: the agreement on rank
        0's table, and one on whether every rank built it (a rank that failed, out of
        memory say, keeps every rank on the old table). See :meth:`Serving.sync`."""
        mine, tuned = self._read_agreed()
        if self._pending_tuned is not None and self._pending_tuned != mine:
            self._set_pending(None, None)  # this rank's registry moved on from it
        new, failed = None, False
        if not tuned:
            self._warn_empty()
        elif tuned != self.tuned and tuned != self._rejected:
            try:
                new = self.pending if tuned == self._pending_tuned else None
                new = new or self._built(tuned)
            except Exception:
                log.exception("%s %s: the agreed table failed to build", self.kernel, self.layer)
                failed = True
        if not self.served.all_true(not failed):
            log.warning(
                "%s %s: a rank could not build the table; every rank keeps its own",
                self.kernel,
                self.layer,
            )
            self._rejected = tuned  # not built again at every sync
            return False
        if new is None:
            return False
        self._swap(new, tuned)
        return True

    def _read_agreed(self) -> tuple[dict[int, KernelConfig], dict[int, KernelConfig]]:
        """(this rank's configs, rank 0's) as the registry holds them now; a collective."""
        try:
            mine = self._read()
        except Exception:  # a rank that skips the agree leaves the others waiting in it
            if not self.collective:
                raise
            log.exception("%s %s: could not read the registry; agreeing", self.kernel, self.layer)
            mine = {}
        agreed = self._agreed(mine)
        if agreed != mine:
            self.version = ()  # rank 0 read another generation: the follower reads again
        return mine, agreed

    def _built(self, tuned: Mapping[int, KernelConfig]) -> Table:
        """The table of ``tuned`` with every config built for the Ms it serves (the
        served layer skips what it built already)."""
        new = self._table(tuned)
        self._prepare(new)
        return new

    def _swap(self, new: Table, tuned: dict[int, KernelConfig]) -> None:
        self.table, self.tuned = new, tuned  # one assignment each: a call reads table once
        self._set_pending(None, None)
        self._rejected = None
        log.info("%s %s: new table, tuned M %s", self.kernel, self.layer, list(new.buckets))

    def _set_pending(self, table: Table | None, tuned: dict[int, KernelConfig] | None) -> None:
        self.pending, self._pending_tuned = table, tuned

    def _algorithm_changes(self, new: Table) -> list[int]:
        """The Ms at which ``new`` runs another algorithm than the current table."""
        old = [config.algorithm for config in self.table.configs]
        now = [config.algorithm for config in new.configs]
        picks = zip(self.table.pick, new.pick, strict=True)
        return [i * self.step for i, (a, b) in enumerate(picks) if i and old[a] != now[b]]

    def _warn_empty(self) -> None:
        log.warning(
            "%s %s: the registry lost every entry; keeping the table", self.kernel, self.layer
        )

    def _read(self) -> dict[int, KernelConfig]:
        """This layer's tuned configs as the registry holds them now; read again if the
        registry changed meanwhile, so no table mixes two generations."""
        for _ in range(3):
            before = self._store.version
            tuned = self._tuned_configs()
            if self._store.version == before:
                break
        self.version = self._store.version
        return tuned

    def _agreed(self, tuned: dict[int, KernelConfig]) -> dict[int, KernelConfig]:
        """Rank 0's configs on every rank of a tensor-parallel group."""
        agreed = self.served.agree({m: config.to_json() for m, config in tuned.items()})
        return {int(m): KernelConfig.from_json(c) for m, c in agreed.items()}

    def _table(self, tuned: Mapping[int, KernelConfig]) -> Table:
        limit = self.layer.max_m // self.step
        if not tuned:
            default = self.served.default_config()
            return Table((), (default,), [0] * (limit + 1), [FALLBACK] * (limit + 1))
        return nearest_table(tuned, step=self.step, max_m=self.layer.max_m)

    def _tuned_configs(self) -> dict[int, KernelConfig]:
        """M -> the best stored config of this layer, one lookup per stored M."""
        layer = self._store.like(
            self.kernel,
            self.served.key(1),
            self._fingerprint,
            self._settings.run.match_policy,
            free=BUCKET_FIELD,
        )
        return {m: entry.best for m, entry in layer.items()}

    def _prepare(self, table: Table) -> None:
        import torch  # torch loads on first use

        rows: list[list[int]] = [[] for _ in table.configs]  # config slot -> the Ms it serves
        for index, slot in enumerate(table.pick[1:], start=1):
            rows[slot].append(index * self.step)
        on_gpu = self.served.device.type == "cuda"  # Triton builds for the thread's device
        with torch.cuda.device(self.served.device) if on_gpu else contextlib.nullcontext():
            for config, ms in zip(table.configs, rows, strict=True):
                done = self._prepared.get(config)
                new = [m for m in ms if done is None or m not in done]
                if done is None or new:  # built already, for these Ms: nothing to do
                    self.served.prepare(config, new)
                    self._prepared.setdefault(config, set()).update(new)

    def _no_entries(self) -> str:
        held = sum(1 for e in self._store.entries() if e.kernel == self.kernel)
        layer = keys.without(self.served.key(1), BUCKET_FIELD)
        return (
            f"No tuned {self.kernel} config for layer {layer} "
            f"on {self._fingerprint.gpu_slug()} (match policy "
            f"{self._settings.run.match_policy.value}) in {self._store.root}; it holds {held} "
            f"{self.kernel} entries for other layers or machines. Warm a manifest with this "
            "layer's shapes first, or pass on_missing='fallback' (counted per call)."
        )


def _preload(settings: Settings) -> Preload | None:
    """The compiler's imports started now, when the manifest declares a model to serve."""
    if settings.serving.preload and declares_models(settings.paths.manifest):
        return Preload(settings)
    return None


class Serving:
    """One per serving process: the registry, this machine's fingerprint, the metrics
    file, the compile guard, and the follower thread of every op it made."""

    def __init__(
        self, settings: Settings | None = None, *, rank: int | None = None, follow: bool = True
    ) -> None:
        """``rank`` names this process's metrics file and label; by default its
        torch.distributed rank. Processes of one pod that share a rank (several
        engines) must pass distinct ones, or they overwrite each other's file."""
        self.settings = settings or Settings()
        self.rank = _rank() if rank is None else rank
        self.services = Services(self.settings)  # built once here: Serving() is an entry point
        self.store = self.services.store()
        self.metrics = ServingMetrics(rank=self.rank)
        self.guard = guard_from_settings(self.settings, self.metrics)  # None when "off"
        self.learned = Recorder(self.settings.paths.metrics_dir, self.rank)
        self.ops: list[ServingOp] = []
        self._exported: dict[tuple[int, int], int] = {}  # (op, source) -> calls exported
        self._lock = threading.RLock()  # ops list and table swaps: the follower vs op()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # a server started again in the same pod is not warm until it says so again
        ServerWarm.path(self.settings.paths.metrics_dir, self.metrics.rank).unlink(missing_ok=True)
        self._manifest: Manifest | None = None
        self.preload = _preload(self.settings)  # the compiler's imports, beside the server's
        _warn_if_autotune_results_are_not_cached()
        if follow:
            self._thread = threading.Thread(target=self._follow, name="triton-warmup-follower")
            self._thread.daemon = True
            self._thread.start()

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
        try:
            adapter = kernels.adapter_for(kernel)
        except KeyError as e:
            raise ServingError(str(e.args[0])) from None
        if on_missing not in ("error", "fallback"):
            raise ServingError(f"on_missing={on_missing!r}; use 'error' or 'fallback'.")
        device, layer = _device(device), Layer(n, k, dtype, max_m)
        served = adapter.serve(layer, group=group, device=device)
        fingerprint = detect_for(device, adapter.kernel_hash())
        with self._lock, self._exempt():
            op = ServingOp(
                served,
                layer,
                store=self.store,
                fingerprint=fingerprint,
                settings=self.settings,
                on_missing=on_missing,
            )
            self.ops.append(op)
        return op

    def model(self, name: str, *, device: Any = None, prime: bool = True) -> ServedModel:
        """The compiled model the manifest declares as ``name``, built by its own
        function on this process's device (``device``: default, its current GPU or the
        CPU) with torch.compile reading the pod's Inductor cache, which the warmup
        filled; with ``prime``, run at every declared shape until steady (CUDA graphs
        recorded), so that Dynamo's tracing (which no cache spares a new process) and
        graph recording are paid here, not by a request; whether it was restored or
        compiled, and why, is logged, counted and kept as ``primed``. Calls run under
        the model's declared mode.
        Raises :class:`ServingError` when the manifest declares no such model or it
        cannot be built or run. Once :meth:`declare_warm` is called, its compiles are
        counted."""
        from warmup.serving.models import build_served  # loads Inductor: only Serving.model

        manifest = self._declared()
        try:
            learned = self._learned_shapes(manifest.model(name))
            with self._exempt():
                return build_served(
                    name,
                    self.settings,
                    device=_device(device),
                    guard=self.guard,
                    prime=prime,
                    manifest=manifest,
                    recorder=self.learned,
                    learned=learned,
                    metrics=self.metrics,
                    before_prime=self.preload.wait if self.preload else None,
                )
        except KeyError as e:
            raise ServingError(str(e.args[0])) from None
        except ValueError as e:
            raise ServingError(f"model {name}: {e}") from None

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
            self._manifest = load_manifest(self.settings.paths.manifest)
        return self._manifest

    def declare_warm(self) -> None:
        """From now on every Triton compile or autotune run in this process is counted
        (``compile_guard=count``) or raises (``strict``); the sidecar's readiness is told
        this rank is warm (``ServerWarm``, with ``ready_after_server``)."""
        if self.guard is not None:
            self.guard.arm()
        self.flush_metrics()
        try:
            digest = self._declared().digest()
        except (ManifestError, OSError):
            digest = ""  # a server without a manifest: its ops only
        warm = ServerWarm(rank=str(self.metrics.rank), manifest_digest=digest, declared=time.time())
        warm.write(self.settings.paths.metrics_dir)

    def refresh(self) -> int:
        """Check the registry now and swap in every op's new table that this rank may
        take alone (see :meth:`ServingOp.refresh`); returns how many swapped. The
        follower calls it; a server may too. Not a collective: any rank, any time."""
        with self._lock, self._exempt():
            self.store.refresh()
            return self._counted([self._refreshed(op) for op in self.ops])

    def sync(self) -> int:
        """Swap in every op's new table, algorithm changes included: each collective op
        takes rank 0's table on every rank of its group (:meth:`ServingOp.sync`). A
        collective: every rank of every collective op's group calls it at the same
        point, where the ranks are in lockstep (a step boundary), as many times as the
        others; each collective op agrees once per call, in the order the ops were made,
        whether anything changed or not. Other ops just refresh. Returns how many ops
        swapped."""
        with self._lock, self._exempt():
            try:
                self.store.refresh()
            except Exception:  # every collective op must still take part below
                log.exception("serving sync: the registry could not be refreshed")
            swapped = [
                op.sync() if op.collective else self._refreshed_safely(op) for op in self.ops
            ]
            return self._counted(swapped)

    def flush_metrics(self) -> None:
        """Export the ops' call counts and pending tables, and write this process's
        metrics file."""
        with self._lock:
            pending: dict[str, int] = {}
            for op in self.ops:
                pending[op.kernel] = pending.get(op.kernel, 0) + (op.pending is not None)
            for kernel, count in pending.items():
                self.metrics.pending_tables.labels(kernel, self.metrics.rank).set(count)
            for number, op in enumerate(self.ops):
                for source, count in enumerate(list(op.calls)):
                    delta = count - self._exported.get((number, source), 0)
                    if delta:
                        labels = (op.kernel, SOURCES[source], self.metrics.rank)
                        self.metrics.calls.labels(*labels).inc(delta)
                        self._exported[(number, source)] = count
        try:
            self.metrics.write(self.settings.paths.metrics_dir)
        except OSError as e:
            log.warning("could not write the serving metrics file: %s", e)

    def close(self) -> None:
        """Stop the follower, write the metrics a last time, disarm the guard; this rank
        is no longer warm."""
        ServerWarm.path(self.settings.paths.metrics_dir, self.metrics.rank).unlink(missing_ok=True)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush_metrics()
        if self.guard is not None:
            self.guard.disarm()

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _follow(self) -> None:
        flushed = time.monotonic()
        while not self._stop.wait(self.settings.serving.refresh_s):
            try:
                self.refresh()
            except Exception:  # the follower must outlive a bad generation
                log.exception("serving follower: refresh failed; keeping the current tables")
            if time.monotonic() - flushed >= METRICS_EVERY_S:  # a file write: not every tick
                self.flush_metrics()  # also, and above all, when refreshes fail
                flushed = time.monotonic()

    def _refreshed_safely(self, op: ServingOp) -> bool:
        """A one-device op's refresh inside a sync: its failure must not stop the
        collective ops after it from taking part (their peers would wait)."""
        try:
            return self._refreshed(op)
        except Exception:
            log.exception("serving sync: %s %s could not refresh", op.kernel, op.layer)
            return False

    def _refreshed(self, op: ServingOp) -> bool:
        """Whether ``op`` swapped; an op built from these very files is not rebuilt."""
        return op.version != self.store.version and op.refresh()

    def _counted(self, swapped: list[bool]) -> int:
        for op, swap in zip(self.ops, swapped, strict=True):
            if swap:
                self.metrics.generation_swaps.labels(op.kernel, self.metrics.rank).inc()
        return sum(swapped)

    def _exempt(self) -> Any:
        """Builds made by the op's owner (construction, follower) are not request compiles."""
        return self.guard.exempt() if self.guard is not None else contextlib.nullcontext()


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
