"""The groups of :class:`warmup.core.settings.Settings`, one per area, as plain data.

Each field keeps the name of its environment variable (``TRITON_WARMUP_<name>``): a
field renamed inside its group (``locks.url``) gives that name as its
``validation_alias`` (``lock_url``). One docstring per field is its description, in the
settings reference (``docs/settings.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo

from registry import families
from registry.core.fingerprint import MatchPolicy
from registry.core.redis_url import is_redis
from registry.core.volume import Volume


def _derived() -> Any:
    """An unset path's placeholder; ``Settings._resolve_defaults`` derives it from the
    settings it follows (after they are validated, so a bad one is the only error)."""
    return None


def derived(alias: str | None = None) -> Any:
    """A field whose unset value is derived from the others (``Settings._defaults``)."""
    return Field(default_factory=_derived, validate_default=False, validation_alias=alias)


class Group(BaseModel):
    """One area's settings: by field name (a dump read back) or by variable name."""

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_by_name=True,
        validate_by_alias=True,
    )

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Each field's setting name (its variable, less the prefix) -> the field."""
        return {str(f.validation_alias or name): name for name, f in cls.model_fields.items()}

    @classmethod
    def described(cls) -> dict[str, FieldInfo]:
        """Each field, as the settings reference describes it."""
        return dict(cls.model_fields)

    def value(self, field: str) -> Any:
        """The field's value; None for a declared one not set yet."""
        return getattr(self, field, None)

    def put_default(self, field: str, value: Any) -> None:
        """``value`` written as a default is: not counted as given."""
        if field in type(self).model_fields:
            self.__dict__[field] = value
        else:  # a setting declared at run time (a pod folder): kept as an extra
            if self.__pydantic_extra__ is None:
                self.__pydantic_extra__ = {}
            self.__pydantic_extra__[field] = value
        self.model_fields_set.discard(field)


class PathSettings(Group):
    """Where things are: the volume, this pod's folders, the files the processes share."""

    volume: Path = Path("demo-volume")
    """the mounted volume's root; run, serve, explain, Serving() and the registry's store
    commands refuse to start unless it is set (a pod always sets it; make demo passes its
    own)"""
    create_volume: bool = False
    """make the volume's folder when it is not there; else run and serve refuse it (exit
    2), so that a mistyped path never starts an empty volume"""
    manifest: Path = Path("examples/demo.yaml")
    """the shape manifest; run, serve, explain and Serving() refuse to start unless it is
    set (a pod always sets it; make demo passes its own)"""
    work_dir: Path = Path("demo-work")
    """this pod's scratch folder"""
    registry_dir: Path = derived()
    """the registry; unset: <volume>/registry"""
    status_file: Path = derived()
    """the run's status, read by the sidecar; unset: <work_dir>/status.json"""
    bundle_dir: Path = derived()
    """watched for bundles; unset: <volume>/bundles"""
    metrics_dir: Path = derived()
    """serving processes write their metrics files here and the sidecar re-exports them;
    unset: <status file's folder>/serving-metrics"""

    @property
    def layout(self) -> Volume:
        """The volume's folders (:class:`registry.core.volume.Volume`)."""
        return Volume(self.volume)

    @property
    def run_metrics_file(self) -> Path:
        """The run's metrics, in Prometheus text format, beside the status file."""
        return self.status_file.with_name("metrics.prom")


class LockSettings(Group):
    """The fleet's locks: where they are held, and how long they are held and waited for."""

    url: str = Field("", validation_alias="lock_url")
    """redis://..., unix://..., or a folder; unset or '': <volume>/locks"""
    fallback: Literal["none", "file"] = Field("none", validation_alias="lock_fallback")
    """a lock server that does not answer when a run starts: fail the run (none), or lock
    with file leases in <volume>/locks for that run (file)"""
    ttl_s: float = Field(60.0, gt=0, validation_alias="lock_ttl_s")
    """a fleet lock's lease: a holder silent this long loses it"""
    timeout_s: float = Field(1800.0, ge=0, validation_alias="lock_timeout_s")
    """how long a shape another pod holds is waited for (and, in a run, a put for the
    store's write lock)"""
    outage_s: float = Field(30.0, ge=0, validation_alias="lock_outage_s")
    """a lock server that stops answering during a run: after this many seconds, shapes
    are tuned without the fleet lock (a warning and a metric)"""


class RemoteSettings(Group):
    """The registry's remote tier on redis, shared by the fleet."""

    url: str = Field("", validation_alias="remote_url")
    """the registry's remote tier (redis://..., rediss://..., unix://...): entries tuned
    anywhere in the fleet; unset or '': the lock server when it is redis, else off; 'off':
    none"""
    redis_password: SecretStr | None = None
    """the password of the redis servers (lock server, remote tier) whose URL carries
    none; set it from a Kubernetes Secret; never logged"""
    triton_timeout_s: float = Field(0.2, gt=0, validation_alias="triton_remote_timeout_s")
    """a Triton cache lookup or publish on the remote tier (warmup.triton_remote_cache)
    waits this long, then compiles locally; the tier is then skipped for 30 s"""

    @field_validator("url")
    @classmethod
    def _a_redis_url(cls, value: str) -> str:
        if value in ("", "off") or is_redis(value):
            return value
        raise ValueError("must be redis://..., rediss://..., unix://..., '' or 'off'")

    def password(self) -> str | None:
        """``redis_password`` itself, for a redis client (never for a message)."""
        return None if self.redis_password is None else self.redis_password.get_secret_value()


class TrustSettings(Group):
    """Which keys artifacts must be signed by, and this pod's own."""

    keys: Path | None = Field(None, validation_alias="trusted_keys")
    """a folder of trusted Ed25519 public keys (*.pub, PEM): bundles and remote-tier values
    must be signed by one of them (unset: no key is trusted, so code from bundles and the
    remote tier is refused and only tuned configs are taken unsigned, unless
    TRITON_WARMUP_ALLOW_UNSIGNED)"""
    bundle_keys: Path | None = Field(None, validation_alias="trusted_bundle_keys")
    """a folder of release public keys (*.pub) that bundles must be signed by instead of
    TRITON_WARMUP_TRUSTED_KEYS: a pod's own key, trusted for remote-tier values, then
    cannot sign a bundle (unset: bundles use TRITON_WARMUP_TRUSTED_KEYS)"""
    signing_key: Path | None = None
    """this pod's Ed25519 private key (PEM): what it publishes to the remote tier is
    signed with it (unset: nothing is signed)"""
    remote_max_age_s: float | None = Field(None, gt=0)
    """the oldest a signed remote-tier value may be, in seconds since it was signed: an
    older one is refused (a freeze attack: a server that keeps handing out stale values);
    unset: no limit (a value older than one this pod saw at its key is refused anyway)"""
    allow_unsigned: bool = False
    """the explicit opt-out for local use: unsigned bundles and remote values, code
    included, are accepted, with trusted keys set or not (logged at start, shown by
    status and doctor, and the metric triton_warmup_trust_mode)"""


class RunSettings(Group):
    """``triton-warmup run`` and its ranks: how many, where, for how long."""

    world_size: int | None = Field(None, ge=1, le=8)
    """None: from the manifest"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where ranks run; auto: cuda when a GPU is visible, else cpu"""
    other_world_sizes: Literal["degraded", "fail"] = "degraded"
    """manifest entries for another world size than the pod's: degraded (ready, named in
    /readyz and triton_warmup_skipped_entries) or fail (bad input, exit 2, before any rank
    starts)"""
    match_policy: MatchPolicy = MatchPolicy.EXACT
    """which stored entries a host may use: exact (every fingerprint field), same-arch
    (same compute capability, software and kernel: H100 -> H200) or any (kernel and shape
    only: a starting point, not a tuned answer)"""
    compile_workers: int | None = Field(None, ge=1)
    """forked compilers per rank while tuning; None: the CPUs the container may use (its
    cgroup limit and affinity), shared by its ranks"""
    rank_timeout_s: float = Field(300.0, gt=0)
    """a silent rank fails the run after"""
    run_timeout_s: float = Field(3600.0, gt=0)
    """the whole run, all ranks"""
    full_hit_exit: bool = True
    """run: when every declared shape and model is stored for a host like this one
    (registry.storage.hosts), restore the caches and exit without starting ranks
    (warmup.run.full_hit); false: always warm in rank processes"""

    def device_type(self, gpus: int) -> Literal["cpu", "cuda"]:
        """Where this process warms, given the GPUs it sees: ``device`` auto takes a GPU
        when there is one; cpu and cuda are what they say (a caller refuses cuda without
        a GPU, in its own words)."""
        if self.device == "auto":
            return "cuda" if gpus else "cpu"
        return self.device


class ModelSettings(Group):
    """Compiled models (``warmup.compiled``): where they compile, and how alike."""

    on_miss: Literal["init", "server"] = Field("init", validation_alias="models_on_miss")
    """run: the declared models are compiled and run in the init container's ranks (init);
    or only restored there, a model not stored being left to the server's priming (server:
    the fleet's first pod compiles once, in its server, and the sidecar's harvest stores it
    for the next pods)"""
    serve: Literal["auto", "package", "compiled"] = Field("auto", validation_alias="models_serve")
    """how the server serves a declared model whose manifest entry says no ``serve:``:
    auto (its compiled package where the model exports and compiles, else torch.compile,
    the reason logged), package (its compiled package only: a model with none fails) or
    compiled (torch.compile reading the pod's Inductor cache)"""
    settle_passes: int = Field(3, ge=0, validation_alias="model_settle_passes")
    """compiled models that tuned at run time (max-autotune) run again in up to this many
    fresh rank processes, until one compiles nothing (warmup.run.settle)"""
    static_launcher: Literal["on", "off"] = "on"
    """Inductor's static CUDA launcher, set alike in the warmup's ranks and the server
    whatever their environments say (it enters the FX graph's cache key): on (torch's own
    default from 2.8: an FX-graph cache hit loads its kernels from the entry, no Triton
    compile) or off (kernels load through Triton's cache, under keys that differ between
    the process that compiled a graph and one that loads it: a fleet's second pod compiles
    them again)"""


class SidecarSettings(Group):
    """``triton-warmup serve``: its address, its bundle watch and its harvest."""

    host: str = Field("0.0.0.0", validation_alias="metrics_host")
    """the sidecar's address"""
    port: int = Field(9400, ge=0, le=65535, validation_alias="metrics_port")
    """the sidecar's port: /healthz /readyz /metrics"""
    reload_debounce_s: float = Field(1.0, ge=0)
    """quiet time before a changed bundle folder is scanned again"""
    ready_after_server: int = Field(0, ge=0, le=64)
    """serve: /readyz also waits for this many server ranks to have primed and declared
    themselves warm (Serving.declare_warm, for this manifest); 0: the init container's
    status alone decides"""
    harvest: bool = True
    """the sidecar publishes what the server compiles after ready (warmup.sidecar.harvest)
    to the volume and the remote tier"""
    harvest_max_per_minute: int = Field(600, ge=1)
    """entries the sidecar harvests a minute; a burst waits"""


class ServingSettings(Group):
    """``Serving()`` in the server's own processes."""

    preload: bool = Field(True, validation_alias="serving_preload")
    """Serving(): when the manifest declares a compiled model, start Dynamo's and
    Inductor's imports on a thread at once, beside the server's own start
    (warmup.serving.preload); Serving.model waits for them"""
    refresh_s: float = Field(1.0, gt=0, validation_alias="serving_refresh_s")
    """how often a serving op checks the registry for a new generation"""
    compile_guard: Literal["count", "strict", "off"] = "count"
    """after a serving process is warm: count (and log) every Triton compile and autotune
    run, raise on them (strict), or do nothing (off)"""


class LogSettings(Group):
    """What the processes log, and how."""

    format: Literal["text", "json"] = Field("text", validation_alias="log_format")
    """log lines as text, or as one JSON object each"""
    debug: bool = False
    """tracebacks with errors (the command line's --debug): the command prints the
    traceback of the error that ends it; the rank processes of a run are given it in their
    settings"""


class FolderSettings(Group):
    """This pod's cache folders: one setting per folder a cache family declares
    (``registry.families``: each family's ``folders``), read from
    ``TRITON_WARMUP_<NAME>``; unset: ``<work_dir>/<its default>``. The declarations are
    read when the settings are, so a family added as a module is a setting here with no
    line of this module changed; a name no family declares is refused."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    if TYPE_CHECKING:  # each declared folder is an attribute: ``folders.triton_cache_dir``

        def __getattr__(self, name: str) -> Path: ...

    @classmethod
    def variables(cls) -> dict[str, str]:
        return {folder.name: folder.name for folder in families.pod_folders()}

    @classmethod
    def described(cls) -> dict[str, FieldInfo]:
        return {
            f.name: FieldInfo(
                annotation=Path, description=f"{f.description}; unset: <work_dir>/{f.default}"
            )
            for f in families.pod_folders()
        }

    @model_validator(mode="after")
    def _declared(self) -> FolderSettings:
        extra = self.__pydantic_extra__ or {}
        unknown = sorted(set(extra) - set(self.variables()))
        if unknown:
            raise ValueError(f"no family declares the pod folder {', '.join(unknown)}")
        for name, value in extra.items():
            if value is not None and not isinstance(value, Path):
                extra[name] = Path(value)
        return self

    def folder(self, name: str) -> Path:
        """The folder of the setting ``name`` (``triton_cache_dir``); KeyError naming the
        declared ones otherwise."""
        found = (self.__pydantic_extra__ or {}).get(name)
        if found is None:
            raise KeyError(f"no pod folder '{name}'; declared: {sorted(self.variables())}")
        assert isinstance(found, Path), found
        return found

    def by_name(self) -> dict[str, Path]:
        """Every pod folder, by its setting's name."""
        return {name: self.folder(name) for name in self.variables()}
