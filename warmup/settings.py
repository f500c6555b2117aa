"""The one typed settings object, read once from ``TRITON_WARMUP_*`` and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from registry import families
from registry.fingerprint import MatchPolicy
from registry.locks import LockBackend, backend_from_url
from registry.redis_url import is_redis
from registry.remote import RemoteTier, remote_tier
from registry.signing import Trust
from registry.store import Store
from registry.volume import Volume, existing_folder


def _derived() -> Any:
    """An unset path's placeholder; :meth:`Settings._resolve_defaults` derives it from
    the settings it follows (after they are validated, so a bad one is the only error)."""
    return None


class Settings(BaseSettings):
    """Embedded defaults run the demo: a local folder as the volume, file locks, CPU."""

    model_config = SettingsConfigDict(env_prefix="TRITON_WARMUP_", extra="forbid")

    volume: Path = Field(Path("demo-volume"), description="the mounted volume's root")
    create_volume: bool = Field(
        False,
        description="make the volume's folder when it is not there; else run and serve "
        "refuse it (exit 2), so that a mistyped path never starts an empty volume",
    )
    manifest: Path = Field(Path("examples/demo.yaml"), description="the shape manifest")
    work_dir: Path = Field(Path("demo-work"), description="this pod's scratch folder")
    pod_folders: dict[str, Path] = Field(
        default_factory=dict,
        description="the cache families' pod folders given, by setting name; each is also "
        "read as TRITON_WARMUP_<NAME> (see 'the families' pod folders' below)",
    )
    registry_dir: Path = Field(
        default_factory=_derived,
        validate_default=False,
        description="the registry; unset: <volume>/registry",
    )
    status_file: Path = Field(
        default_factory=_derived,
        validate_default=False,
        description="the run's status, read by the sidecar; unset: <work_dir>/status.json",
    )
    bundle_dir: Path = Field(
        default_factory=_derived,
        validate_default=False,
        description="watched for bundles; unset: <volume>/bundles",
    )
    lock_url: str = Field(
        "", description="redis://..., unix://..., or a folder; unset or '': <volume>/locks"
    )
    lock_fallback: Literal["none", "file"] = Field(
        "none",
        description="a lock server that does not answer when a run starts: fail the run "
        "(none), or lock with file leases in <volume>/locks for that run (file)",
    )
    remote_url: str = Field(
        "",
        description="the registry's remote tier (redis://..., rediss://..., unix://...): "
        "entries tuned anywhere in the fleet; unset or '': the lock server when it is redis, "
        "else off; 'off': none",
    )
    redis_password: SecretStr | None = Field(
        None,
        description="the password of the redis servers (lock server, remote tier) whose URL "
        "carries none; set it from a Kubernetes Secret; never logged",
    )
    lock_ttl_s: float = Field(
        60.0, gt=0, description="a fleet lock's lease: a holder silent this long loses it"
    )
    lock_timeout_s: float = Field(
        1800.0,
        ge=0,
        description="how long a shape another pod holds is waited for (and, in a run, a "
        "put for the store's write lock)",
    )
    lock_outage_s: float = Field(
        30.0,
        ge=0,
        description="a lock server that stops answering during a run: after this many "
        "seconds, shapes are tuned without the fleet lock (a warning and a metric)",
    )
    compile_workers: int | None = Field(
        None,
        ge=1,
        description="forked compilers per rank while tuning; None: the CPUs the container "
        "may use (its cgroup limit and affinity), shared by its ranks",
    )
    rank_timeout_s: float = Field(300.0, gt=0, description="a silent rank fails the run after")
    model_settle_passes: int = Field(
        3,
        ge=0,
        description="compiled models that tuned at run time (max-autotune) run again in up "
        "to this many fresh rank processes, until one compiles nothing (warmup.run.settle)",
    )
    run_timeout_s: float = Field(3600.0, gt=0, description="the whole run, all ranks")
    models_on_miss: Literal["init", "server"] = Field(
        "init",
        description="run: the declared models are compiled and run in the init "
        "container's ranks (init); or only restored there, a model not stored being left "
        "to the server's priming (server: the fleet's first pod compiles once, in its "
        "server, and the sidecar's harvest stores it for the next pods)",
    )
    static_launcher: Literal["on", "off"] = Field(
        "on",
        description="Inductor's static CUDA launcher, set alike in the warmup's ranks and "
        "the server whatever their environments say (it enters the FX graph's cache "
        "key): on (torch's own default from 2.8: an FX-graph cache hit loads its "
        "kernels from the entry, no Triton compile) or off (kernels load through "
        "Triton's cache, under keys that differ between the process that compiled a "
        "graph and one that loads it: a fleet's second pod compiles them again)",
    )
    serving_preload: bool = Field(
        True,
        description="Serving(): when the manifest declares a compiled model, start "
        "Dynamo's and Inductor's imports on a thread at once, beside the server's own "
        "start (warmup.serving.preload); Serving.model waits for them",
    )
    ready_after_server: int = Field(
        0,
        ge=0,
        le=64,
        description="serve: /readyz also waits for this many server ranks to have primed "
        "and declared themselves warm (Serving.declare_warm, for this manifest); 0: the "
        "init container's status alone decides",
    )
    full_hit_exit: bool = Field(
        True,
        description="run: when every declared shape and model is stored for a host like "
        "this one (registry.hosts), restore the caches and exit without starting ranks "
        "(warmup.run.full_hit); false: always warm in rank processes",
    )
    world_size: int | None = Field(None, ge=1, le=8, description="None: from the manifest")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where ranks run; auto: cuda when a GPU is visible, else cpu"
    )
    other_world_sizes: Literal["degraded", "fail"] = Field(
        "degraded",
        description="manifest entries for another world size than the pod's: degraded "
        "(ready, named in /readyz and triton_warmup_skipped_entries) or fail (bad input, "
        "exit 2, before any rank starts)",
    )
    match_policy: MatchPolicy = Field(
        MatchPolicy.EXACT,
        description="which stored entries a host may use: exact (every fingerprint field), "
        "same-arch (same compute capability, software and kernel: H100 -> H200) or any "
        "(kernel and shape only: a starting point, not a tuned answer)",
    )
    metrics_host: str = Field("0.0.0.0", description="the sidecar's address")
    metrics_port: int = Field(
        9400, ge=0, le=65535, description="the sidecar's port: /healthz /readyz /metrics"
    )
    reload_debounce_s: float = Field(
        1.0, ge=0, description="quiet time before a changed bundle folder is scanned again"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="log lines as text, or as one JSON object each"
    )
    debug: bool = Field(
        False,
        description="tracebacks with errors (the command line's --debug): the command "
        "prints the traceback of the error that ends it; the rank processes of a run "
        "are given it in their settings",
    )
    metrics_dir: Path = Field(
        default_factory=_derived,
        validate_default=False,
        description="serving processes write their metrics files here and the sidecar "
        "re-exports them; unset: <status file's folder>/serving-metrics",
    )
    compile_guard: Literal["count", "strict", "off"] = Field(
        "count",
        description="after a serving process is warm: count (and log) every Triton compile "
        "and autotune run, raise on them (strict), or do nothing (off)",
    )
    harvest: bool = Field(
        True,
        description="the sidecar publishes what the server compiles after ready "
        "(warmup.sidecar.harvest) to the volume and the remote tier",
    )
    harvest_max_per_minute: int = Field(
        600, ge=1, description="entries the sidecar harvests a minute; a burst waits"
    )
    triton_remote_timeout_s: float = Field(
        0.2,
        gt=0,
        description="a Triton cache lookup or publish on the remote tier "
        "(warmup.triton_remote_cache) waits this long, then compiles locally; the tier is "
        "then skipped for 30 s",
    )
    serving_refresh_s: float = Field(
        1.0, gt=0, description="how often a serving op checks the registry for a new generation"
    )
    trusted_keys: Path | None = Field(
        None,
        description="a folder of trusted Ed25519 public keys (*.pub, PEM): bundles and "
        "remote-tier values must be signed by one of them (unset: trust not configured, "
        "everything accepted with a warning)",
    )
    trusted_bundle_keys: Path | None = Field(
        None,
        description="a folder of release public keys (*.pub) that bundles must be signed by "
        "instead of TRITON_WARMUP_TRUSTED_KEYS: a pod's own key, trusted for remote-tier "
        "values, then cannot sign a bundle (unset: bundles use TRITON_WARMUP_TRUSTED_KEYS)",
    )
    signing_key: Path | None = Field(
        None,
        description="this pod's Ed25519 private key (PEM): what it publishes to the remote "
        "tier is signed with it (unset: nothing is signed)",
    )
    allow_unsigned: bool = Field(
        False,
        description="the explicit opt-out for local use: unsigned bundles and remote values "
        "are accepted even with trusted keys set (logged at start)",
    )

    def existing_volume(self, fix: str | None = None) -> Path:
        """The volume's folder, made first with ``create_volume``;
        :class:`registry.volume.MissingFolder` when it is not there, saying ``fix`` (how
        to create it, in the caller's words: the CLI's flags by default)."""
        fix = fix or (
            "check --volume (TRITON_WARMUP_VOLUME), or create it with --create-volume "
            "(TRITON_WARMUP_CREATE_VOLUME=true)"
        )
        return existing_folder(self.volume, what="volume", create=self.create_volume, fix=fix)

    @property
    def paths(self) -> Volume:
        return Volume(self.volume)

    def device_type(self, gpus: int) -> Literal["cpu", "cuda"]:
        """Where this process warms, given the GPUs it sees: ``device`` auto takes a GPU
        when there is one; cpu and cuda are what they say (a caller refuses cuda without
        a GPU, in its own words)."""
        if self.device == "auto":
            return "cuda" if gpus else "cpu"
        return self.device

    def store(self, *, run: bool = False, check_interval: float = 0.0) -> Store:
        """The registry's store, as every process opens it. A ``run``'s puts wait up to
        ``lock_timeout_s`` for the store's write lock (an install may hold it), others
        the store's own default; ``check_interval``: how often a reader looks for a new
        generation (0: at every read)."""
        # The volume's own store: existing_volume guards the volume; its first write makes it.
        if run:
            wait = self.lock_timeout_s
            return Store(
                self.registry_dir, lock_timeout=wait, check_interval=check_interval, create=True
            )
        return Store(self.registry_dir, check_interval=check_interval, create=True)

    def remote(self, *, timeout_s: float = 1.0) -> RemoteTier | None:
        """The registry's remote tier (each call's deadline: ``timeout_s``); None
        when it is off; :class:`registry.RegistryError` for a URL it cannot use."""
        return remote_tier(
            self.remote_url,
            timeout_s=timeout_s,
            password=self.redis_secret(),
            trust=self.trust(),
        )

    def lock_backend(self, url: str | None = None) -> LockBackend:
        """The lock backend at ``url`` (by default ``lock_url``), with the redis password."""
        return backend_from_url(self.lock_url if url is None else url, password=self.redis_secret())

    def redis_secret(self) -> str | None:
        """``redis_password`` itself, for a redis client (never for a message)."""
        return None if self.redis_password is None else self.redis_password.get_secret_value()

    def trust(self) -> Trust:
        """What this process accepts and signs with (:class:`registry.signing.Trust`);
        :class:`registry.signing.KeyFileError` for a key folder or file it cannot use."""
        return Trust.load(
            self.trusted_keys,
            bundle_keys_dir=self.trusted_bundle_keys,
            signing_key=self.signing_key,
            allow_unsigned=self.allow_unsigned,
        )

    @property
    def run_metrics_file(self) -> Path:
        """The run's metrics, in Prometheus text format, beside the status file."""
        return self.status_file.with_name("metrics.prom")

    @field_validator("remote_url")
    @classmethod
    def _a_redis_url(cls, value: str) -> str:
        if value in ("", "off") or is_redis(value):
            return value
        raise ValueError("must be redis://..., rediss://..., unix://..., '' or 'off'")

    @model_validator(mode="after")
    def _resolve_defaults(self) -> Settings:
        """Each setting has one name: an unset path or an empty URL becomes its default
        here, so that ``settings.registry_dir`` is the registry wherever it is read, and
        a dump read back (the ranks' ``settings.json``) is the same settings. What was
        derived stays out of ``model_fields_set`` (:meth:`given` tells them apart)."""
        return self._fill_defaults()

    def _fill_defaults(self) -> Settings:
        """Every unset derived field given its default; ``self``."""
        for name, default in self._defaults().items():
            self._derive(name, default)
        return self

    def _defaults(self) -> dict[str, Any]:
        """What each derived setting is when unset, from the settings it follows."""
        paths, work = self.paths, self.work_dir
        status = self.status_file or work / "status.json"
        return {
            "registry_dir": paths.registry,
            "status_file": status,
            "bundle_dir": paths.bundles,
            "metrics_dir": status.parent / "serving-metrics",
            "remote_url": self.lock_url if is_redis(self.lock_url) else "off",
            "lock_url": str(paths.locks),
        }

    def _derive(self, name: str, default: Any) -> None:
        """``default`` for an unset (or empty) field, written as a default is: not set."""
        if not getattr(self, name):
            self.__dict__[name] = default
            self.model_fields_set.discard(name)

    def updated(self, **changes: Any) -> Settings:
        """These settings with ``changes``, and every default derived again from them
        (``model_copy`` would keep the defaults derived from the old values); '' unsets
        a path or URL. Reads no environment, as ``model_copy`` does not."""
        copy = self.model_copy(update=changes)
        for name in self._defaults().keys() - self.model_fields_set - changes.keys():
            copy.__dict__[name] = "" if isinstance(getattr(self, name), str) else None
        return copy._fill_defaults()

    def given(self, name: str) -> bool:
        """Whether the field ``name`` was given (a keyword, the environment, a dump read
        back), not derived from the others."""
        return name in self.model_fields_set or name in self.pod_folders

    # ---- the families' pod folders ---------------------------------------------------
    # Each cache family declares its pod folders (registry.families.PodFolder): one
    # setting each, TRITON_WARMUP_<NAME>, unset: <work_dir>/<its default>. They are kept
    # by name in ``pod_folders`` (given ones only) and read as attributes, so a new
    # family's folder is a setting without a line here.

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment of every declared pod folder, after the keywords."""
        folders = _PodFolderEnv(settings_cls)
        return init_settings, folders, env_settings, dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _pod_folders_by_name(cls, data: Any) -> Any:
        """A pod folder given by its name (``triton_cache_dir=...``) joins ``pod_folders``
        (over the environment's); an empty one is unset."""
        if not isinstance(data, dict):
            return data
        names = {folder.name for folder in families.pod_folders()}
        given = {**data.get("pod_folders", {}), **{k: v for k, v in data.items() if k in names}}
        rest = {k: v for k, v in data.items() if k not in names}
        return {**rest, "pod_folders": {k: v for k, v in given.items() if v not in ("", None)}}

    def pod_folder(self, name: str) -> Path:
        """The pod folder of setting ``name``: as given, else its default under the work
        dir; KeyError for a name no family declares."""
        if name in self.pod_folders:
            return self.pod_folders[name]
        declared = {folder.name: folder for folder in families.pod_folders()}
        if name not in declared:
            raise KeyError(f"no family declares the pod folder '{name}'; see {sorted(declared)}")
        return self.work_dir / declared[name].default

    def pod(self) -> dict[str, Path]:
        """Every declared pod folder, by setting name."""
        return {folder.name: self.pod_folder(folder.name) for folder in families.pod_folders()}

    def __getattr__(self, name: str) -> Path:
        """A declared pod folder as an attribute (``settings.triton_cache_dir``)."""
        if not name.startswith("_") and name in {f.name for f in families.pod_folders()}:
            return self.pod_folder(name)
        parent = cast(Any, BaseSettings).__getattr__  # pydantic's: private attributes
        return cast(Path, parent(self, name))


class _PodFolderEnv(EnvSettingsSource):
    """``TRITON_WARMUP_<NAME>`` of each pod folder the families declare, as the
    environment gives any setting (names in any case; empty: unset)."""

    def __call__(self) -> dict[str, Any]:
        found = {}
        for folder in families.pod_folders():
            env = folder.env if self.case_sensitive else folder.env.lower()
            if self.env_vars.get(env):
                found[folder.name] = self.env_vars[env]
        return {"pod_folders": found} if found else {}
