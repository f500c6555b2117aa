"""The one typed settings object, read once from ``TRITON_WARMUP_*`` and passed down.

Plain data, grouped by area (``warmup.core.settings_groups``): ``settings.paths.volume``,
``settings.locks.url``, ``settings.run.device``... Each field is still read from the
variable it always was (``TRITON_WARMUP_VOLUME``, ``TRITON_WARMUP_LOCK_URL``), and
``Settings(volume=..., lock_url=...)`` takes the same names as keywords. What is built from
the settings (the store, the remote tier, the locks, the trust) is built by
``warmup.core.services``, once, at each entry point.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from registry import families
from registry.core.errors import BadInput
from registry.core.redis_url import is_redis
from warmup.core.settings_groups import (
    FolderSettings,
    Group,
    LockSettings,
    LogSettings,
    ModelSettings,
    PathSettings,
    RemoteSettings,
    RunSettings,
    ServingSettings,
    SidecarSettings,
    TrustSettings,
)

PREFIX = "TRITON_WARMUP_"


class Settings(BaseSettings):
    """Every setting has a default, so that a test or a library call can make settings
    from a few keywords; the manifest and the volume's are placeholders, which ``run``,
    ``serve``, ``explain``, the registry's store commands and ``Serving()`` refuse unless
    given (:func:`require`): a pod sets both."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="forbid", use_attribute_docstrings=True
    )

    paths: PathSettings = Field(default_factory=PathSettings)
    """the volume, this pod's folders, the files its processes share"""
    folders: FolderSettings = Field(default_factory=FolderSettings)
    """the cache families' folders in this pod, one per folder a family declares"""
    locks: LockSettings = Field(default_factory=LockSettings)
    """the fleet's locks"""
    remote: RemoteSettings = Field(default_factory=RemoteSettings)
    """the registry's remote tier"""
    trust: TrustSettings = Field(default_factory=TrustSettings)
    """the keys artifacts must be signed by, and this pod's own"""
    run: RunSettings = Field(default_factory=RunSettings)
    """the run and its ranks"""
    models: ModelSettings = Field(default_factory=ModelSettings)
    """compiled models"""
    sidecar: SidecarSettings = Field(default_factory=SidecarSettings)
    """the sidecar (``serve``)"""
    serving: ServingSettings = Field(default_factory=ServingSettings)
    """``Serving()`` in the server"""
    logs: LogSettings = Field(default_factory=LogSettings)
    """logging"""

    if TYPE_CHECKING:  # only typed: a real __init__ would run on model_validate too

        def __init__(self, **values: Any) -> None:
            """Any setting by its name (``Settings(volume=..., lock_url=...)``), or a group
            whole (``Settings(locks=LockSettings(...))``); then the environment's."""

    @classmethod
    def names(cls) -> dict[str, tuple[str, str]]:
        """Every setting's name (its variable less ``TRITON_WARMUP_``, its keyword) ->
        (its group, its field in the group)."""
        return {
            name: (group, field)
            for group, info in cls.model_fields.items()
            for name, field in _group_class(info).variables().items()
        }

    @classmethod
    def fields(cls) -> Iterator[tuple[str, str, FieldInfo]]:
        """(variable, attribute path such as ``locks.url``, field) for every setting."""
        for name, (group, field) in cls.names().items():
            info = _group_class(cls.model_fields[group]).described()[field]
            yield PREFIX + name.upper(), f"{group}.{field}", info

    @classmethod
    def variable(cls, loc: tuple[int | str, ...]) -> str:
        """The variable of a validation error's location: ``('locks', 'lock_ttl_s')``
        (a variable or keyword) or ``('locks', 'ttl_s')`` (a dump read back)."""
        names = cls.names()
        by_field = {place: name for name, place in names.items()}
        parts = [str(part) for part in loc[:2]]
        last = parts[-1] if parts else ""
        name = last if last in names or len(parts) < 2 else by_field.get((parts[0], last), last)
        return PREFIX + name.upper()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # the keywords first, then each group's fields from their flat variables
        return init_settings, FlatEnvironment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _grouped(cls, data: Any) -> Any:
        """Keywords by setting name (``Settings(volume=...)``) into their groups; a name
        given both ways takes the keyword's value."""
        return route(data, cls.names()) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _resolve_defaults(self) -> Settings:
        """Each setting has one value: an unset path or an empty URL becomes its default
        here, so that ``settings.paths.registry_dir`` is the registry wherever it is read,
        and a dump read back (the ranks' ``settings.json``) is the same settings. What was
        derived stays out of its group's ``model_fields_set`` (:meth:`given`)."""
        return self._fill_defaults()

    def _fill_defaults(self) -> Settings:
        """Every unset derived field given its default; ``self``."""
        names = self.names()  # once: it reads every family's declared folders
        for name, default in self._defaults().items():
            group_name, field = names[name]
            group = getattr(self, group_name)
            if not group.value(field):  # unset or empty
                group.put_default(field, default)
        return self

    def _defaults(self) -> dict[str, Any]:
        """What each derived setting is when unset, from the settings it follows."""
        layout, work = self.paths.layout, self.paths.work_dir
        status = self.paths.status_file or work / "status.json"
        return {
            **{folder.name: work / folder.default for folder in families.pod_folders()},
            "registry_dir": layout.registry,
            "status_file": status,
            "bundle_dir": layout.bundles,
            "metrics_dir": status.parent / "serving-metrics",
            "remote_url": self.locks.url if is_redis(self.locks.url) else "off",
            "lock_url": str(layout.locks),
        }

    def updated(self, **changes: Any) -> Settings:
        """These settings with ``changes`` (by setting name: ``updated(lock_url="")``),
        and every default derived again from them (``model_copy`` would keep the defaults
        derived from the old values); '' unsets a path or URL. Reads no environment, as
        ``model_copy`` does not."""
        names = self.names()
        unknown = changes.keys() - names.keys()
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        rederived = {names[n] for n in self._defaults().keys() - changes.keys()}
        updates: dict[str, dict[str, Any]] = {group: {} for group in type(self).model_fields}
        for name, value in changes.items():
            group, field = names[name]
            updates[group][field] = value
        groups: dict[str, Group] = {}
        for group_name, update in updates.items():
            group = getattr(self, group_name)
            groups[group_name] = copy = group.model_copy(update=update)
            for field in {f for g, f in rederived if g == group_name} - group.model_fields_set:
                copy.put_default(field, "" if isinstance(group.value(field), str) else None)
        return self.model_copy(update=groups)._fill_defaults()

    def given(self, name: str) -> bool:
        """Whether the setting ``name`` was given (a keyword, the environment, a dump
        read back), not derived from the others."""
        group, field = self.names()[name]
        return field in getattr(self, group).model_fields_set


def _group_class(info: FieldInfo) -> type[Group]:
    annotation = info.annotation
    assert isinstance(annotation, type) and issubclass(annotation, Group), annotation
    return annotation


def route(data: Mapping[str, Any], names: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """``data`` with each setting given by name moved into its group, under its field's
    name (so that a dump read back, by field, and the environment, by variable, merge
    field by field); the rest as it is. A name given both ways takes the flat value."""
    out: dict[str, Any] = {}
    flat: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in names:
            group, field = names[key]
            flat.setdefault(group, {})[field] = value
        else:
            out[key] = value
    for group, values in flat.items():
        held = out.get(group, {})
        if isinstance(held, Group):  # a group given whole: its given fields, then these
            held = {f: getattr(held, f) for f in held.model_fields_set}
        out[group] = {**held, **values}
    return out


class FlatEnvironment(PydanticBaseSettingsSource):
    """Each group's fields from their variables, ``TRITON_WARMUP_<name>`` (any case), as
    pydantic-settings' environment source reads a flat model; the groups have no
    variables of their own."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # read per group in __call__

    def __call__(self) -> dict[str, Any]:
        environ = {key.upper(): value for key, value in os.environ.items()}
        found: dict[str, Any] = {}
        for name in Settings.names():
            value = environ.get(PREFIX + name.upper())
            if value is not None:
                found[name] = value
        return route(found, Settings.names())


class SettingsError(BadInput, ValueError):
    """Settings that cannot be used: bad values, or one a caller needs not given. Its
    message is one line naming each variable (bad input: exit 2)."""


def from_environment() -> Settings:
    """``Settings()`` read from the environment; :class:`SettingsError` (one line, each
    bad variable with its value and what is allowed) instead of pydantic's report."""
    try:
        return Settings()
    except ValidationError as e:
        raise SettingsError(f"bad settings: {describe_errors(e)}") from None


def describe_errors(error: ValidationError, options: Mapping[str, str] | None = None) -> str:
    """One line: each bad setting as its variable (or ``options``' name for it: a
    command line's ``--world-size``), the value given, and what is allowed."""
    parts = []
    for detail in error.errors():
        variable = Settings.variable(detail["loc"])
        setting = variable.removeprefix(PREFIX).lower()
        name = (options or {}).get(setting, variable)
        parts.append(f"{name}={detail.get('input')!r}: {detail['msg'].lower()}")
    return "; ".join(parts)


def require(
    settings: Settings, names: Iterable[str], *, who: str, ways: Mapping[str, str] | None = None
) -> None:
    """:class:`SettingsError` when a setting of ``names`` was not given (its default is a
    placeholder, never a pod's): one line saying that ``who`` needs it, and how to give
    each (``ways``' words for it, else its variable)."""
    missing = [name for name in names if not settings.given(name)]
    if not missing:
        return
    named = [f"the {name.replace('_', ' ')}" for name in missing]
    needed = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    how = "; ".join((ways or {}).get(name, PREFIX + name.upper()) for name in missing)
    raise SettingsError(f"{who} needs {needed}: give {how}")
