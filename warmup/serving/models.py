"""A declared compiled model in the server: built by the manifest's own function, so
what is served is what was warmed, on the Inductor cache the warmup filled.

    serving = Serving()                       # one per process (warmup.serving)
    model = serving.model("blocks")           # the manifest's build(device=...), primed
    serving.declare_warm()                    # from here a compile is counted (or refused)
    logits = model(tokens)

Once the process is declared warm, every call reads Dynamo's and Inductor's counters
around itself: a call that compiled (a new shape, a guard that failed, an FX graph cache
miss, a Triton kernel, an autotune benchmark) is counted per model by the compile guard
(``triton_warmup_model_request_compiles``), logged with its causes and their fixes
(``warmup.compiled.causes``: ``batch=1`` not declared, an inference tensor, an input
that requires grad, a grad mode...), and refused in strict mode. The counters are the
process's: a compile on another thread during the call (another model's, a kernel's
JIT) is charged to this call too.

Every call runs under the model's declared ``mode`` (``no_grad``, ``inference_mode``,
``grad``), the one it was warmed and primed in, whatever the caller's context. Priming
(``warmup.serving.priming``) runs each shape, with each kind of input a server sends,
until it is steady (``PRIME_CALLS``: CUDA graphs recorded and replayed), then logs
one line: ``restored`` (from the pod's Inductor cache, and which of
the volume's indexes the init container restored there, with how many files) or
``compiled`` and why (the init container's status file: no status, another key, its
failure, its restore's miss reason, a cache this process does not share); a status whose
torch, Triton or GPU differ from this process's is logged and counted, not refused: its
artifacts just miss.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from registry.caches import inductor_cache
from registry.core.errors import RegistryError, named
from registry.core.fingerprint import Fingerprint, detect_for
from registry.core.triton_internals import cache_env
from warmup.compiled import coordesc
from warmup.compiled.causes import Cause, dynamo_reasons, explain
from warmup.compiled.counters import CompileCounts, snapshot
from warmup.compiled.environment import inductor_environment
from warmup.compiled.inputs import current_mode, grad_mode
from warmup.compiled.key import model_key
from warmup.compiled.learned import Recorder
from warmup.compiled.warm import build_model
from warmup.core.manifest import Manifest, ModelEntry, load_manifest
from warmup.core.results import RUNNING, ModelResult, RankHost, RunStatus
from warmup.core.settings import Settings
from warmup.serving.priming import prime_all

if TYPE_CHECKING:
    from warmup.serving.compile_guard import CompileGuard
    from warmup.serving.metrics import ServingMetrics

log = logging.getLogger(__name__)

FACTORS = {
    "torch": ("software", "torch"),
    "triton": ("software", "triton"),
    "gpu_name": ("hardware", "gpu_name"),
}
"""What the server compares with the init container's fingerprint: where each factor sits
in ``registry.core.fingerprint.Fingerprint.to_json()``. Bounded: they are metric labels."""
MAX_FACTOR = 80  # a value read from the status file, shown in one log line

Outcome = Literal["restored", "compiled"]


@dataclass(frozen=True)
class Primed:
    """What priming a model cost in the server: ``restored`` when it compiled nothing
    (the warmup's artifacts hit; Dynamo's tracing, paid by every process, aside), with
    the ``source`` of its artifacts, else ``compiled`` with the ``cause`` the init
    container's status gives."""

    outcome: Outcome
    seconds: float
    counts: CompileCounts  # over the build and every priming call
    cause: str  # why it compiled; "" when restored
    calls: int  # priming calls, every shape's
    source: str = ""  # where the artifacts came from; "" when compiled

    def describe(self, name: str) -> str:
        """One log line: ``model blocks: restored (3 FX-graph hits, 0 compiles) in 1.20 s
        from the pod's Inductor cache ...`` or ``model blocks: compiled cold (...): why``."""
        c = self.counts
        if self.outcome == "restored":
            source = f" from {self.source}" if self.source else ""
            return (
                f"model {name}: restored ({c.fxgraph_hits} FX-graph hits, 0 compiles) "
                f"in {self.seconds:.2f} s{source}"
            )
        graphs = f"{c.fxgraph_misses} FX-graph misses"
        how = "cold"  # not one FX graph came from a cache
        if c.fxgraph_hits:
            graphs, how = f"{c.fxgraph_hits} FX-graph hits, {c.fxgraph_misses} misses", "in part"
        tuned = f", {c.autotune_runs} autotune benchmarks" if c.autotune_runs else ""
        return (
            f"model {name}: compiled {how} ({graphs}, {c.kernel_compiles} Triton compiles"
            f"{tuned}) in {self.seconds:.2f} s: {self.cause}"
        )


class ServedModel:
    """A declared model's callable; calls run under the model's declared mode (whatever
    the caller's: Dynamo guards on it), counted once the guard is armed. A call that
    compiled has its dims recorded (``recorder``) for the next pods to warm, and its
    causes told to the guard. ``primed``: what priming cost (None when not primed);
    ``learned``: the learned dims it primed."""

    def __init__(
        self,
        entry: ModelEntry,
        function: Callable[..., Any],
        guard: CompileGuard | None,
        recorder: Recorder | None = None,
    ) -> None:
        self.entry, self.function, self.guard = entry, function, guard
        self.recorder = recorder
        self.primed: Primed | None = None
        self.learned: list[dict[str, int]] = []
        self.package_note = ""  # why a model that could be packaged is not ('' otherwise)

    served_as = "compiled"  # through torch.compile (warmup.serving.packaged: "package")

    @property
    def name(self) -> str:
        return self.entry.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.guard is None or not self.guard.armed:
            with grad_mode(self.entry):
                return self.function(*args, **kwargs)
        caller, before = current_mode(), snapshot()
        with grad_mode(self.entry):
            output = self.function(*args, **kwargs)
        costs = (snapshot() - before).request_costs()
        if costs:
            if self.recorder is not None:
                self.recorder.record(self.entry, args)
            causes = self._causes(args, list(kwargs), caller, costs.get("dynamo_frames", 0))
            self.guard.model_costs(self.name, costs, causes)
        return output

    def _causes(
        self, args: tuple[Any, ...], kwargs: list[str], caller: str, frames: int
    ) -> list[Cause]:
        """Why a call compiled (``warmup.compiled.causes``); never raises: the request has
        its answer, and the guard counts it whatever the causes."""
        try:
            reasons = dynamo_reasons(frames)
            return explain(
                self.entry, args, kwargs=kwargs, learned=self.learned, caller=caller,
                reasons=reasons, new_graph=frames > 0,
            )  # fmt: skip
        except Exception as e:  # a call the manifest cannot describe: counted all the same
            log.warning("model %s: why a call compiled not found: %s", self.name, named(e))
            return []


def build_served(
    name: str,
    settings: Settings,
    *,
    device: Any,
    guard: CompileGuard | None,
    manifest: Manifest | None = None,
    prime: bool = True,
    recorder: Recorder | None = None,
    learned: list[dict[str, int]] | None = None,
    metrics: ServingMetrics | None = None,
    before_prime: Callable[[], None] | None = None,
) -> ServedModel:
    """The model declared as ``name`` in ``manifest`` (default: the settings' manifest),
    built on ``device`` with torch.compile reading the pod's Inductor cache, and with
    ``prime`` run to its steady state (``warmup.serving.priming``) at every declared shape, then
    at each of ``learned`` (the shapes the fleet learned, ``warmup.compiled.learned``: the
    same list on every rank, a failure logged, not fatal). The init container's status
    (``settings.status_file``) is compared with this process first (:func:`mismatches`)
    and says why a prime compiled; the outcome is logged, counted in ``metrics`` and kept
    as ``served.primed``. ``before_prime``: called before the model is built (the
    compiler's imports, ``warmup.serving.preload``, waited for: a build that imports
    Dynamo while the preload's thread does could get a module half made). KeyError when the
    manifest declares no such model, ValueError when it cannot be built or fails at a
    shape."""
    manifest = manifest or load_manifest(settings.paths.manifest)
    entry = manifest.model(name)
    status = RunStatus.read(settings.paths.status_file)
    differ = mismatches(status, device)
    _report_mismatches(name, differ, metrics)
    cache_empty = _cache_empty(settings)  # before this process writes to it
    use_inductor_cache(settings)
    if status is not None and status.fingerprint is None:  # before anything compiles
        _tell_host(settings, device)
    started, before = time.perf_counter(), snapshot()
    if before_prime is not None:  # no import of Dynamo by two threads at once
        before_prime()
    served = ServedModel(entry, build_model(entry, device), guard, recorder)
    if not prime:
        return served
    calls, served.learned = prime_all(served.function, entry, learned or [], device)
    counts = snapshot() - before
    compiled = _compiled(counts)
    served.primed = Primed(
        outcome="compiled" if compiled else "restored",
        seconds=time.perf_counter() - started,
        counts=counts,
        cause=_cause(settings, status, entry, differ, cache_empty) if compiled else "",
        calls=calls,
        source="" if compiled else _source(settings, status, name),
    )
    log.info("%s", served.primed.describe(name))
    if metrics is not None:
        metrics.model_primes.labels(name, served.primed.outcome, metrics.rank).inc()
    return served


def _tell_host(settings: Settings, device: Any) -> None:
    """The init container started no rank to detect this host (``leave_to_the_server``):
    every rank writes what it detects (one host: the same file) beside its metrics,
    before it compiles anything, where the sidecar's harvest reads
    it to store what this process compiles, and to record the host for the next pod.
    Written before the first compile: the harvest takes only what is compiled after
    it knows the host (half a second, in the fleet's first pod only)."""

    try:
        host = RankHost(fingerprint=detect_for(device).to_json(), triton_env=cache_env())
        settings.paths.metrics_dir.mkdir(parents=True, exist_ok=True)
        host.write(settings.paths.metrics_dir)
    except Exception as e:  # the harvest goes without: the next pod compiles again
        log.warning("this host's fingerprint not written for the harvest: %s", named(e))


def _compiled(counts: CompileCounts) -> bool:
    """Whether priming made anything the warmup should have restored (Dynamo's tracing
    is paid by every new process: not counted)."""
    c = counts
    return bool(c.fxgraph_misses or c.inductor_compiles or c.kernel_compiles or c.autotune_runs)


def mismatches(status: RunStatus | None, device: Any) -> dict[str, tuple[str, str]]:
    """The factors of :data:`FACTORS` in which the init container's fingerprint (its
    status) differs from this process on ``device``: ``{factor: (init's, server's)}``;
    empty without a status or a fingerprint in it."""
    found = status.fingerprint if status is not None else None
    if not isinstance(found, dict):
        return {}
    here = server_factors(device)
    differ = {}
    for factor, (part, field) in FACTORS.items():
        section = found.get(part)
        theirs = section.get(field) if isinstance(section, dict) else None
        if theirs is not None and str(theirs) != here[factor]:
            differ[factor] = (str(theirs)[:MAX_FACTOR], here[factor])
    return differ


def server_factors(device: Any) -> dict[str, str]:
    """This process's torch and Triton versions and the GPU name (``cpu`` off CUDA), as
    ``registry.core.fingerprint`` writes them, read without detecting the whole fingerprint."""
    import torch  # torch loads on first use

    try:
        import triton  # triton loads on first use

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    cuda = getattr(device, "type", device) == "cuda"
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
    return {"torch": str(torch.__version__), "triton": triton_version, "gpu_name": gpu}


def _report_mismatches(
    name: str, differ: dict[str, tuple[str, str]], metrics: ServingMetrics | None
) -> None:
    if not differ:
        return
    shown = "; ".join(f"{f} {init} (init) vs {here} (server)" for f, (init, here) in differ.items())
    log.warning(
        "model %s: the init container warmed with another %s: %s; its artifacts will miss "
        "here (run the warmup in the server's image)",
        name,
        " and ".join(differ),
        shown,
    )
    if metrics is not None:
        for factor in differ:
            metrics.warmup_mismatches.labels(factor, metrics.rank).inc()


def _cause(
    settings: Settings,
    status: RunStatus | None,
    entry: ModelEntry,
    differ: dict[str, tuple[str, str]],
    cache_empty: bool,
) -> str:
    """Why priming compiled, from the init container's status: none, a run not finished,
    or what it says of the model (:func:`_warmup_said`); then the factors that differ."""
    if status is None:
        why = f"no warmup status at {settings.paths.status_file}"
    elif status.state == RUNNING:
        why = "the warmup had not finished (its status says running)"
    else:
        why = _warmup_said(settings, _warmup_record(status, entry.name), entry, cache_empty)
    if differ:
        why += "; init vs server " + ", ".join(f"{f} {a} vs {b}" for f, (a, b) in differ.items())
    return why


def _warmup_said(
    settings: Settings, record: ModelResult | None, entry: ModelEntry, cache_empty: bool
) -> str:
    """Why priming compiled, from the warmup's record of the model: none, its failure,
    another key (the model's code or shapes changed since), left to the server, or its
    restore (``hit`` or ``miss: why``) and whether this process found the pod's cache."""
    if record is None:
        return f"the warmup status has no model {entry.name}"
    if record.failed:
        return f"the warmup failed it: {record.error or record.phase}"
    mine = _key_digest(entry)
    if record.key_digest and mine and record.key_digest != mine:
        return (
            f"the model's code or shapes changed since the warmup (key {mine[:12]}, "
            f"warmed {record.key_digest[:12]})"
        )
    restore = record.restore or "unknown"
    if record.phase == "deferred":
        return f"the warmup left it to the server: {restore}"
    why = f"warmup restore: {restore}"
    if cache_empty:  # the warmup filled a cache folder this process does not see
        return (
            f"{why}; the pod's Inductor cache {settings.folders.inductor_cache_dir} held nothing "
            "here: not the folder the warmup filled"
        )
    if restore.startswith("hit") or record.phase == "warm":  # the cache held the model
        why += (
            "; this process missed the warmup's artifacts (an Inductor setting, the "
            "environment or code outside the build's module differs)"
        )
    return why


def _source(settings: Settings, status: RunStatus | None, name: str) -> str:
    """Where a restored prime's artifacts came from: the pod's Inductor cache, and what
    the init container put there (the volume's index it restored, with how many files,
    or its own compile)."""
    cache = f"the pod's Inductor cache {settings.folders.inductor_cache_dir}"
    record = _warmup_record(status, name)
    if status is None or record is None:
        return cache
    restore = record.restore or "none"
    if record.phase == "warm" and not restore.startswith("hit"):
        return f"{cache}, where the warmup compiled it (its restore: {restore})"
    if not restore.startswith("hit"):  # an earlier server, a bundle's reload: after the warmup
        return f"{cache}, filled after the warmup ({record.phase}; its restore: {restore})"
    found = _index_files(settings, status, record)
    if found is None:
        return f"{cache}, restored there by the warmup ({record.restore})"
    files, index = found
    return f"{cache}: {files} artifacts the warmup restored from {index} ({record.restore})"


def _warmup_record(status: RunStatus | None, name: str) -> ModelResult | None:
    """The model's record in the warmup's status: rank 0's, which restored it."""
    records = [m for m in status.models if m.name == name] if status is not None else []
    return next((m for m in records if m.restore), records[0] if records else None)


def _index_files(
    settings: Settings, status: RunStatus, record: ModelResult
) -> tuple[int, Path] | None:
    """The volume's index of the warmup's key and fingerprint, and how many files it
    lists; None when it cannot be read here (no volume mounted, no fingerprint)."""
    try:
        fingerprint = Fingerprint.from_json(status.fingerprint)
        root = settings.paths.layout.inductor
        path = inductor_cache.index_path(root, record.name, record.key_digest, fingerprint)
        return len(inductor_cache.read_index(path)["files"]), path
    except (OSError, RegistryError):  # the line says less: the model is served all the same
        return None


def _key_digest(entry: ModelEntry) -> str:
    """The model's key here; '' when it cannot be read (then not compared)."""
    try:
        return model_key(entry).digest
    except Exception:  # an unreadable source, a parent package that raises
        return ""


def _cache_empty(settings: Settings) -> bool:
    """Whether the pod's Inductor cache holds no file at all (read up to the first)."""
    try:
        return next(inductor_cache.cache_files(settings.folders.inductor_cache_dir), None) is None
    except OSError:  # a file gone while listed: not empty, as far as the cause goes
        return False


def use_inductor_cache(settings: Settings) -> None:
    """Point torch.compile in this process at the pod's Inductor cache (where the warmup
    restored and wrote the artifacts), with its FX graph and AOTAutograd caches on and
    the static CUDA launcher as in the warmup's ranks."""

    wanted = inductor_environment(settings)
    held = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if held and os.path.abspath(held) != wanted["TORCHINDUCTOR_CACHE_DIR"]:
        log.warning(
            "TORCHINDUCTOR_CACHE_DIR=%s is replaced by the warmup's %s (set "
            "TRITON_WARMUP_INDUCTOR_CACHE_DIR to choose it)",
            held,
            wanted["TORCHINDUCTOR_CACHE_DIR"],
        )
    jit = wanted.pop("CUDA_CACHE_PATH")
    if os.environ.get("CUDA_CACHE_PATH") != jit and _cuda_started():
        log.warning(
            "CUDA started before CUDA_CACHE_PATH=%s was set: torch's first calls JIT-compile "
            "what the warmup cached there; set it in the server's environment (the chart does)",
            jit,
        )
    os.environ.update({**wanted, "CUDA_CACHE_PATH": jit})
    _static_launcher(settings.models.static_launcher == "on")
    coordesc.install()  # no coordinate-descent benchmark on a cache hit (torch 2.11)


def _static_launcher(on: bool) -> None:
    """Inductor reads its knobs from the environment when its config is first imported,
    which a server may have done already: the static launcher is set there too
    (``warmup.compiled.environment.STATIC_LAUNCHER``: as the warmup compiled)."""
    from torch._inductor import config  # torch loads on first use

    if hasattr(config, "use_static_cuda_launcher"):
        config.use_static_cuda_launcher = on


def _cuda_started() -> bool:
    import torch  # torch loads on first use

    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
