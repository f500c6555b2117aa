"""What a warmup run reports, typed: one writer each, typed readers, no dicts.

A rank process writes its :class:`RankReport` (one :class:`ShapeResult` per shape) into
the run folder; the launcher (or rank 0) reads them all back and writes the
:class:`RunStatus` that the readiness probe, ``triton-warmup status`` and the metrics
read. Imports neither torch nor triton: the sidecar reads the status too.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)

from registry.core import atomic
from registry.core.fingerprint import machine_name

MAX_STATUS_BYTES = 64 * 2**20  # 4096 shapes x 8 ranks of results fit many times over

# registry/bundles/bundle: a stored config (bundle: one a bundle install wrote); remote: one the
# registry's remote tier had (another node's pod tuned it), now stored here too; tuned: found
# by tuning now; fallback: the kernel's default, by policy; user: a ``module:function``
# entry, whose kernels choose their own configs; failed: no config (``error`` says why).
Source = Literal["registry", "bundle", "remote", "tuned", "fallback", "user", "failed"]
HIT_SOURCES: tuple[Source, ...] = ("registry", "bundle", "remote")
# each source in words, for a person reading a summary without the source code
SOURCE_WORDS: dict[str, str] = {
    "registry": "found in the registry",
    "bundle": "from a bundle",
    "remote": "from the remote tier",
    "tuned": "tuned",
    "fallback": "on the kernel's default config",
    "user": "warmed by the user's function",
    "failed": "failed",
}
State = Literal["running", "ready", "failed"]
RUNNING: State = "running"
READY: State = "ready"
FAILED: State = "failed"


class _Record(BaseModel):
    # A reader ignores fields a newer writer added (the sidecar and the init container
    # may run different versions); the mypy plugin refuses unknown fields in our code.
    model_config = ConfigDict(extra="ignore")


class ShapeResult(_Record):
    """One manifest shape warmed on one rank."""

    kernel: str
    key: dict[str, Any]
    rank: int = 0
    source: Source | str  # a newer writer's source reads too
    config: dict[str, Any] | None = None
    seconds: float = 0.0  # finding the config: lookup, or the whole tuning
    compile_seconds: float | None = None  # a stored config's first launch and check
    benchmark_runs: int = 0
    lock_wait_s: float = 0.0
    unlocked: bool = False  # tuned without the fleet lock: its server did not answer
    error: str | None = None

    @property
    def hit(self) -> bool:
        return self.source in HIT_SOURCES

    @property
    def miss(self) -> bool:
        """No stored config: tuned now, or fell back (user and failed shapes are neither)."""
        return self.source in ("tuned", "fallback")

    @property
    def failed(self) -> bool:
        return self.error is not None

    @field_validator("seconds", mode="before")
    @classmethod
    def _no_time(cls, value: Any) -> Any:
        return 0.0 if value is None else value  # earlier versions wrote null

    def describe(self) -> str:
        shape = " ".join(f"{k}={v}" for k, v in self.key.items() if k in ("M", "N", "K"))
        return f"{self.kernel} {shape or self.key}".strip()


# restored: its artifacts copied for the server (a full hit, or models_on_miss=server);
# deferred: none stored, the server compiles it (models_on_miss=server)
ModelPhase = Literal["warm", "restored", "deferred", "packaged", "failed"]
PRIMED_BY_THE_SERVER = ("restored", "deferred", "packaged")


class ModelResult(_Record):
    """One declared compiled model warmed on one rank: every shape compiled (or loaded
    from the restored cache) and run once, or failed with a one-line reason."""

    name: str
    rank: int = 0
    phase: ModelPhase | str  # a newer writer's phase reads too
    seconds: float = 0.0  # restore, build, every shape, store
    restore: str = ""  # before the compile: hit, or miss with the reason (rank 0; '' elsewhere)
    shapes: list[dict[str, Any]] = []  # {"dims": {...}, "seconds": first call's}
    counts: dict[str, int] = {}  # warmup.compiled.counters.CompileCounts during the warm
    stored_artifacts: int = 0  # files of the Inductor cache stored after the compile (rank 0)
    error: str | None = None
    settle: list[dict[str, Any]] = []  # warmup.run.settle: each pass's counts (or error)
    settled: bool = False  # the last settle pass compiled nothing on any rank
    key_digest: str = ""  # warmup.compiled.key: where its artifacts are stored
    package: str = ""  # its compiled package: restored, made, failed (why); '' not asked

    @property
    def failed(self) -> bool:
        return self.error is not None or self.phase not in ("warm", *PRIMED_BY_THE_SERVER)

    def describe(self) -> str:
        line = self._described()
        if self.package and self.phase != "packaged":  # auto without a package: why
            line += f"; no package: {self.package}"
        return line

    def _described(self) -> str:
        if self.phase in PRIMED_BY_THE_SERVER:
            took, what = f"{self.seconds:.2f} s", self.restore or "nothing stored"
            if self.phase == "deferred":
                return f"model {self.name}: left to the server to compile in {took} ({what})"
            if self.phase == "packaged":
                return f"model {self.name}: packaged for the server in {took} ({self.package})"
            return f"model {self.name}: restored for the server in {took} ({what})"
        compiled = self.counts.get("inductor_compiles", 0)
        hits = self.counts.get("fxgraph_hits", 0)
        what = f"{len(self.shapes)} shapes, {compiled} graphs compiled, {hits} cache hits"
        artifacts = f"; {self.artifacts()}" if self.restore else ""  # rank 0's business
        settle = ""
        if self.settle:
            end = "nothing left to compile" if self.settled else "still compiling"
            settle = f"; {len(self.settle)} settle passes, {end}"
        return (
            f"model {self.name}: {self.phase} ({what}) in {self.seconds:.2f} s{artifacts}{settle}"
        )

    def artifacts(self) -> str:
        """What became of the model's stored artifacts on rank 0: restored before the
        compile or not (and why), then how many were stored after it:
        ``no artifacts restored (no artifacts of model m are stored), 26 stored now``."""
        outcome, _, why = self.restore.partition(": ")
        if outcome == "hit":
            restored = "artifacts restored"
        elif outcome.startswith("hit ("):  # hit (3 artifacts recompiled)
            restored = f"artifacts restored {outcome[len('hit ') :]}"
        elif outcome == "miss":
            restored = f"no artifacts restored ({why})"
        elif outcome == "failed":
            restored = f"artifacts not restored: the restore failed ({why})"
        else:  # a newer writer's outcome
            restored = f"restore: {self.restore}"
        return f"{restored}, {self.stored_artifacts or 'none'} stored now"


class RemoteCounts(_Record):
    """Calls to the registry's remote tier (``registry.remote.tier.RemoteStats``): hits and
    misses of lookups, entries published, calls that failed, calls skipped while down."""

    hits: int = 0
    misses: int = 0
    published: int = 0
    errors: int = 0
    skipped: int = 0

    def __add__(self, other: RemoteCounts) -> RemoteCounts:
        mine, theirs = self.model_dump(), other.model_dump()
        return RemoteCounts.model_validate({k: v + theirs[k] for k, v in mine.items()})


class RankReport(_Record):
    """Everything one rank did; written once, as ``rank-<r>.json`` in the run folder."""

    rank: int
    world: int
    fingerprint: dict[str, Any] | None = None
    seconds: float = 0.0
    phases: dict[str, float] = {}  # warmup.run.phases: seconds per phase on this rank
    remote: RemoteCounts | None = None  # None: this rank asked no remote tier
    shapes: list[ShapeResult] = []
    models: list[ModelResult] = []
    written: float = 0.0  # the rank's clock (time.time()) when it wrote it; 0: not said

    def write(self, run_dir: Path, *, restamp: bool = True) -> Path:
        """Written with the time it is written (the pod's clock, not a volume's mtime);
        ``restamp=False``: with the time it says (a report the launcher amends)."""
        path = run_dir / f"rank-{self.rank}.json"
        dated = self.model_copy(update={"written": time.time()}) if restamp else self
        atomic.write_bytes(path, dated.model_dump_json().encode())
        return path

    @classmethod
    def read_all(cls, run_dir: Path) -> list[RankReport]:
        """Every rank's report in the folder, by rank; an unreadable one is an error."""
        reports = [
            cls.model_validate_json(atomic.read_bounded(p, MAX_STATUS_BYTES))
            for p in run_dir.glob("rank-*.json")
        ]
        return sorted(reports, key=lambda r: r.rank)


class RankHost(_Record):
    """What rank 0 detected of its host, written as soon as it knows: the launcher's
    ``explain`` compares the caches with it before anything compiles, with no CUDA of
    its own (a context there could take an exclusive-mode GPU from the ranks)."""

    fingerprint: dict[str, Any]
    triton_env: dict[str, str] = {}  # the knobs that enter Triton's cache keys

    FILE: ClassVar[str] = "host.json"

    def write(self, run_dir: Path) -> Path:
        path = run_dir / self.FILE
        atomic.write_bytes(path, self.model_dump_json().encode())
        return path

    @classmethod
    def read(cls, folder: Path) -> RankHost | None:
        """The file in ``folder``; None when there is none or it is unreadable."""
        try:
            return cls.model_validate_json(atomic.read_bounded(folder / cls.FILE, MAX_STATUS_BYTES))
        except (OSError, ValidationError, ValueError):
            return None

    @classmethod
    def wait(cls, run_dir: Path, timeout_s: float, stop: threading.Event) -> RankHost | None:
        """The file once rank 0 wrote it; None when unreadable, or not written within
        ``timeout_s`` or before ``stop`` is set."""
        deadline = time.monotonic() + timeout_s
        path = run_dir / cls.FILE
        while not path.exists():
            if time.monotonic() > deadline or stop.wait(0.2):
                if path.exists():
                    break
                return None
        try:
            return cls.model_validate_json(atomic.read_bounded(path, MAX_STATUS_BYTES))
        except (OSError, ValidationError, ValueError):
            return None


RankEnd = Literal["exited", "stopped", "silent", "timeout"]


class ServerWarm(_Record):
    """A server rank that primed and declared itself warm (``Serving.declare_warm``),
    written beside its metrics for the sidecar's readiness; its rank removes it when it
    starts again or closes."""

    rank: str  # the serving process's rank label
    manifest_digest: str  # what it primed: the manifest it read
    declared: float  # time.time()

    PREFIX: ClassVar[str] = "warm-rank"

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = self.path(folder, self.rank)
        atomic.write_bytes(path, self.model_dump_json().encode())
        return path

    @classmethod
    def path(cls, folder: Path, rank: object) -> Path:
        return folder / f"{cls.PREFIX}{rank}.json"

    @classmethod
    def read_all(cls, folder: Path, limit: int = 64) -> list[ServerWarm]:
        """The records in ``folder`` (at most ``limit`` read), the unreadable left out."""
        found = []
        for path in sorted(folder.glob(f"{cls.PREFIX}*.json"))[:limit]:
            try:
                found.append(cls.model_validate_json(atomic.read_bounded(path, 4096)))
            except (OSError, ValidationError, ValueError):
                continue
        return found


class RankFailure(_Record):
    """A rank process that did not finish its work: one per rank, the first cause."""

    rank: int
    end: RankEnd | str
    code: int | None = None  # exited: the process's exit code

    def __str__(self) -> str:
        return {
            "exited": f"rank {self.rank} exited with code {self.code}",
            "stopped": f"rank {self.rank} was stopped",
            "silent": f"rank {self.rank} reported nothing",
            "timeout": f"rank {self.rank} was still running at the run's time limit",
        }.get(self.end, f"rank {self.rank}: {self.end}")


class RunStatus(_Record):
    """The status file: what the readiness probe reads. ``ready`` only when every rank
    reported, every shape of the manifest's entries for this world size is warm, and
    there was at least one."""

    state: State
    manifest_digest: str
    started: float
    finished: float | None = None
    duration_s: float | None = None
    host: str = ""
    world_size: int
    fingerprint: dict[str, Any] | None = None
    triton_env: dict[str, str] = {}  # the knobs in Triton's cache keys the ranks had
    errors: list[str] = []  # run-level: bad input, the time limit, a rank that lied
    rank_failures: list[RankFailure] = []
    skipped_entries: list[str] = []  # entries made for another world size
    benchmark_runs: int = 0
    saved_artifacts: int = 0
    imported_entries: int = 0
    phases: dict[str, float] = {}  # warmup.run.phases: seconds per phase, the slowest rank's
    remote: RemoteCounts | None = None  # the registry's remote tier; None: not used
    shapes: list[ShapeResult] = []
    models: list[ModelResult] = []  # every rank's, by model then rank
    full_hit: bool = False  # warmup.run.full_hit: restored and exited, no rank started
    # registry.trust.signing.Trust.mode: signed, code-refused or unsigned-allowed (the opt-out)
    trust: str = ""
    # registry.storage.hosts: this host's probe, when no rank detected its fingerprint (the
    # server's does, and the harvest records the host under this probe for the next pod)
    probe: dict[str, Any] | None = None
    # registry.families.engine_key: each declared folder's engine-key facts as the init
    # container (the server's image and environment) saw them; the sidecar's harvest
    # records these, not its own image's, so the next pod compares like with like
    engine_keys: dict[str, dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _older_failures(cls, data: Any) -> Any:
        """A status written before ``errors`` existed kept its reasons in ``failures``."""
        if isinstance(data, dict) and "failures" in data and "errors" not in data:
            failures = data["failures"]
            if isinstance(failures, list):
                return {**data, "errors": [str(f) for f in failures]}
            return {**data, "errors": failures if failures is not None else []}  # else invalid
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sources(self) -> dict[str, int]:
        """Shape-rank results by where their config came from."""
        counts: dict[str, int] = {}
        for shape in self.shapes:
            counts[shape.source] = counts.get(shape.source, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def shape_sources(self) -> dict[str, int]:
        """Kernel shapes by where their config came from, each shape counted once however
        many ranks reported it (``sources`` counts a result per shape and rank, and a full
        hit, which starts no rank, has one per shape): the lowest rank's source, or
        ``failed`` when any rank failed it."""
        by_shape: dict[str, list[ShapeResult]] = {}
        for shape in self.shapes:
            name = f"{shape.kernel} {json.dumps(shape.key, sort_keys=True, default=str)}"
            by_shape.setdefault(name, []).append(shape)
        counts: dict[str, int] = {}
        for results in by_shape.values():
            failed = [r for r in results if r.failed]
            source = "failed" if failed else str(min(results, key=lambda r: r.rank).source)
            counts[source] = counts.get(source, 0) + 1
        return dict(sorted(counts.items()))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failures(self) -> list[str]:
        """Every reason the run is not ready, one line each (shown by the probe and CLI)."""
        return [
            *self.errors,
            *map(str, self.rank_failures),
            *(f"{s.describe()} (rank {s.rank}): {s.error}" for s in self.shapes if s.failed),
            *(
                f"model {m.name} (rank {m.rank}): {m.error or m.phase}"
                for m in self.models
                if m.failed
            ),
        ]

    @property
    def ready(self) -> bool:
        return self.state == READY

    @computed_field  # type: ignore[prop-decorator]
    @property
    def degraded(self) -> bool:
        """Ready for this pod's world size, with manifest entries for other world sizes
        left unwarmed (the ``degraded`` policy of ``other_world_sizes``): the probe says so."""
        return self.ready and bool(self.skipped_entries)

    @classmethod
    def ended(
        cls,
        *,
        ready: bool,
        manifest_digest: str,
        world: int,
        started: float,
        duration: float,
        **fields: Any,
    ) -> RunStatus:
        """The status of a run that ends now on this host, ready or failed."""

        return cls(
            state=READY if ready else FAILED,
            manifest_digest=manifest_digest,
            started=started,
            finished=time.time(),
            duration_s=duration,
            host=machine_name(),
            world_size=world,
            **fields,
        )

    def failed(self, errors: list[str]) -> RunStatus:
        """This status, ended now as failed for ``errors``."""
        return self.model_copy(update={"state": FAILED, "finished": time.time(), "errors": errors})

    def write(self, path: Path) -> RunStatus:
        """Atomically replace the status file (a reader sees the old one or the new one)."""
        atomic.write_bytes(path, self.model_dump_json(indent=1).encode())
        return self

    @classmethod
    def read(cls, path: Path) -> RunStatus | None:
        """The status, or None when there is none yet or it is unreadable or foreign
        (not JSON, nested too deep, a wrong type anywhere); never raises."""
        try:
            data = atomic.read_bounded(path, MAX_STATUS_BYTES, follow_links=True)
            return cls.model_validate_json(data)
        except (OSError, ValidationError, ValueError, TypeError, RecursionError):
            return None  # the probe and the CLI must answer whatever the file holds
