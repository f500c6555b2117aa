from pathlib import Path

import pytest
from pydantic import ValidationError

from registry import MatchPolicy
from warmup.cli import main
from warmup.core.settings import Settings


def test_defaults_run_the_demo_locally():
    settings = Settings()
    assert settings.paths.volume == Path("demo-volume")
    assert settings.paths.layout.registry == Path("demo-volume/registry")
    assert settings.locks.url == "demo-volume/locks"


def test_environment_overrides_with_the_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path))
    monkeypatch.setenv("TRITON_WARMUP_MATCH_POLICY", "same-arch")
    monkeypatch.setenv("TRITON_WARMUP_LOCK_URL", "redis://redis:6379/0")
    settings = Settings()
    assert settings.paths.layout.triton_cache == tmp_path / "triton-cache"
    assert settings.run.match_policy is MatchPolicy.SAME_ARCH
    assert settings.locks.url == "redis://redis:6379/0"
    assert settings.paths.registry_dir == tmp_path / "registry"
    monkeypatch.setenv("TRITON_WARMUP_REGISTRY_DIR", "/srv/registry")
    assert Settings().paths.registry_dir == Path("/srv/registry")


def test_each_setting_has_one_name_and_its_default_is_resolved_once(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_WARMUP_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("TRITON_WARMUP_LOCK_URL", "")  # a chart's empty value is unset
    settings = Settings(volume=tmp_path / "volume", status_file=tmp_path / "run" / "s.json")
    assert settings.folders.triton_cache_dir == tmp_path / "work" / "triton-cache"
    assert settings.folders.inductor_cache_dir == tmp_path / "work" / "inductor-cache"
    assert settings.paths.bundle_dir == tmp_path / "volume" / "bundles"
    assert settings.paths.metrics_dir == tmp_path / "run" / "serving-metrics"  # follows the status
    assert settings.locks.url == str(tmp_path / "volume" / "locks")
    assert not [name for name in vars(Settings) if name.endswith(("_path", "_location"))]
    monkeypatch.delenv("TRITON_WARMUP_WORK_DIR")
    with pytest.raises(ValidationError) as bad:
        Settings(world_size=0)
    assert bad.value.error_count() == 1  # the bad value alone, not the paths derived after it
    # what the ranks read back from settings.json is the same settings
    assert Settings.model_validate_json(settings.model_dump_json()) == settings


def test_bad_values_name_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_WARMUP_LOCK_TTL_S", "-3")
    with pytest.raises(ValidationError):
        Settings()
    assert main(["registry", "ls"]) == 2
    assert "TRITON_WARMUP_LOCK_TTL_S" in capsys.readouterr().err


def test_the_remote_tier_follows_a_redis_lock_unless_set_or_off(monkeypatch):
    assert Settings().remote.url == "off"  # file leases: no remote tier
    redis = "redis://cache:6379/0"
    assert Settings(lock_url=redis).remote.url == redis
    assert Settings(lock_url=redis, remote_url="off").remote.url == "off"
    assert Settings(lock_url=redis, remote_url="").remote.url == redis  # '' is unset
    other = "rediss://other:6380/1"
    assert Settings(lock_url="/locks", remote_url=other).remote.url == other
    with pytest.raises(ValidationError, match="redis://"):
        Settings(remote_url="http://cache")


def test_where_a_process_warms_is_decided_in_one_place():
    assert Settings().run.device_type(gpus=0) == "cpu"  # auto: the CPU without a GPU
    assert Settings().run.device_type(gpus=2) == "cuda"  # auto: a GPU when there is one
    assert Settings(device="cpu").run.device_type(gpus=8) == "cpu"
    assert Settings(device="cuda").run.device_type(gpus=0) == "cuda"  # its caller refuses it


def test_a_derived_default_is_told_apart_from_a_given_value():
    settings = Settings()
    assert not settings.given("triton_cache_dir") and not settings.given("remote_url")
    assert Settings(triton_cache_dir="/cache").given("triton_cache_dir")
    assert not Settings(remote_url="").given("remote_url")  # '' is unset
    read_back = Settings.model_validate_json(settings.model_dump_json())
    assert read_back.given("remote_url") and read_back == settings  # a dump is all given


def test_the_registry_cli_installs_triton_files_in_the_volume_unless_told(tmp_path):
    from warmup.cli import _place, build_parser

    def default_cache(settings, *before):
        from registry.cli.common import fill_family_defaults

        parser = build_parser(settings)
        args = parser.parse_args(["registry", *before, "bundle", "install", "b.tar.gz"])
        args.store = getattr(args, "store", None)
        fill_family_defaults(args, _place(settings))
        return args.triton_cache

    volume, other = tmp_path / "volume", tmp_path / "other"
    assert default_cache(Settings(volume=volume)) == volume / "triton-cache"
    assert default_cache(Settings(volume=volume, triton_cache_dir="/c")) == Path("/c")
    # a volume named on the command line is the one written, whatever the pod's folders
    named = default_cache(Settings(volume=volume, triton_cache_dir="/c"), "--volume", str(other))
    assert named == other / "triton-cache"
    stored = default_cache(Settings(triton_cache_dir="/c"), "--store", str(other / "registry"))
    assert stored == other / "triton-cache"
    assert default_cache(Settings()) is None  # no volume named: nowhere by default


def test_an_update_derives_the_defaults_again_and_reads_no_environment(monkeypatch, tmp_path):
    settings = Settings(work_dir=tmp_path / "a", lock_url="redis://cache:6379/0")
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path / "elsewhere"))  # read once
    monkeypatch.setenv("TRITON_WARMUP_LOCK_URL", "redis://other:6379/0")  # not even for a default
    moved = settings.updated(work_dir=tmp_path / "b", lock_url="")
    assert (
        moved.folders.triton_cache_dir == tmp_path / "b" / "triton-cache"
    )  # follows the new folder
    assert moved.locks.url == str(settings.paths.layout.locks) and moved.remote.url == "off"
    assert moved.paths.volume == settings.paths.volume
    assert moved.updated(device="cpu").locks.url == moved.locks.url  # derived, not the variable


OLD_VARIABLES = {  # every variable the flat settings read before the groups (and since), a value
    "VOLUME": "/v", "CREATE_VOLUME": "true", "MANIFEST": "/m.yaml", "WORK_DIR": "/w",
    "TRITON_CACHE_DIR": "/tc", "INDUCTOR_CACHE_DIR": "/ic", "REGISTRY_DIR": "/r",
    "STATUS_FILE": "/s.json", "BUNDLE_DIR": "/b", "LOCK_URL": "redis://l:6379/0",
    "LOCK_FALLBACK": "file", "REMOTE_URL": "redis://r:6379/1", "REDIS_PASSWORD": "pw",
    "LOCK_TTL_S": "7", "LOCK_TIMEOUT_S": "8", "LOCK_OUTAGE_S": "9", "COMPILE_WORKERS": "3",
    "RANK_TIMEOUT_S": "11", "MODEL_SETTLE_PASSES": "2", "RUN_TIMEOUT_S": "12",
    "MODELS_ON_MISS": "server", "STATIC_LAUNCHER": "off", "SERVING_PRELOAD": "false",
    "READY_AFTER_SERVER": "2", "FULL_HIT_EXIT": "false", "WORLD_SIZE": "4", "DEVICE": "cpu",
    "OTHER_WORLD_SIZES": "fail", "MATCH_POLICY": "any", "METRICS_HOST": "127.0.0.2",
    "METRICS_PORT": "9401", "RELOAD_DEBOUNCE_S": "2.5", "LOG_FORMAT": "json", "DEBUG": "true",
    "METRICS_DIR": "/md", "COMPILE_GUARD": "strict", "HARVEST": "false",
    "HARVEST_MAX_PER_MINUTE": "5", "TRITON_REMOTE_TIMEOUT_S": "0.5",
    "SERVING_REFRESH_S": "3", "TRUSTED_KEYS": "/k", "TRUSTED_BUNDLE_KEYS": "/bk",
    "SIGNING_KEY": "/sk", "ALLOW_UNSIGNED": "true",
    "MODELS_SERVE": "package", "PACKAGE_DIR": "/pk",  # [5.2]: new, not old
    "REMOTE_MAX_AGE_S": "3600",  # [5.3]: new, not old
}  # fmt: skip


def test_every_old_variable_is_read_into_its_group(monkeypatch):
    assert {f"TRITON_WARMUP_{n}" for n in OLD_VARIABLES} == {v for v, _, _ in Settings.fields()}
    for name, value in OLD_VARIABLES.items():
        monkeypatch.setenv(f"TRITON_WARMUP_{name}", value)
    settings = Settings()
    for variable, attribute, _ in Settings.fields():
        group, field = attribute.split(".")
        got = getattr(getattr(settings, group), field)
        given = OLD_VARIABLES[variable.removeprefix("TRITON_WARMUP_")]
        shown = got.get_secret_value() if hasattr(got, "get_secret_value") else got
        shown = getattr(shown, "value", shown)  # an enum
        assert str(shown).lower() == given.lower() or float(str(shown)) == float(given), variable
        assert settings.given(variable.removeprefix("TRITON_WARMUP_").lower())


def test_settings_are_grouped_and_a_keyword_or_a_variable_lands_in_its_group(monkeypatch):
    assert list(Settings.model_fields) == [
        "paths", "folders", "locks", "remote", "trust", "run", "models", "sidecar", "serving",
        "logs",
    ]  # fmt: skip
    monkeypatch.setenv("triton_warmup_lock_ttl_s", "5")  # any case, as before
    settings = Settings(lock_url="/l", trusted_keys="/k", metrics_port=1)
    assert (settings.locks.url, settings.locks.ttl_s) == ("/l", 5.0)
    assert (settings.trust.keys, settings.sidecar.port) == (Path("/k"), 1)
    assert Settings(locks={"url": "/g"}, lock_ttl_s=3).locks.ttl_s == 3  # a group, by name
    with pytest.raises(ValidationError):
        Settings(lock_urll="/typo")  # extra='forbid', as before
    with pytest.raises(ValidationError) as bad:
        Settings(metrics_port=-1)
    assert Settings.variable(bad.value.errors()[0]["loc"]) == "TRITON_WARMUP_METRICS_PORT"
    assert Settings.variable(("locks", "ttl_s")) == "TRITON_WARMUP_LOCK_TTL_S"  # a dump's


def test_every_setting_has_a_docstring_and_settings_build_nothing():
    for variable, attribute, field in Settings.fields():
        assert field.description, f"{variable} ({attribute}) has no docstring"
    for name in ("store", "remote_tier", "lock_backend", "existing_volume", "redis_secret"):
        assert not hasattr(Settings, name)
    assert not callable(Settings().trust) and not callable(Settings().remote)


def test_a_grouped_dump_round_trips_exactly_and_keeps_the_secret_out(tmp_path):
    settings = Settings(
        volume=tmp_path, lock_url="redis://l:6379/0", redis_password="s3cret", device="cpu"
    )
    dumped = settings.model_dump(mode="json")
    assert set(dumped) == set(Settings.model_fields) and dumped["run"]["device"] == "cpu"
    assert "s3cret" not in repr(settings) and "s3cret" not in str(dumped)
    read_back = Settings.model_validate_json(settings.model_dump_json())
    assert read_back.model_dump() == Settings.model_validate(dumped).model_dump()
    assert read_back.paths == settings.paths and read_back.locks == settings.locks
    assert read_back.remote.url == "redis://l:6379/0" and read_back.given("remote_url")


def test_an_update_changes_only_its_copy():
    settings = Settings(lock_url="redis://l:6379/0")
    moved = settings.updated(lock_url="", device="cpu")
    assert settings.locks.url == "redis://l:6379/0" and settings.run.device == "auto"
    assert moved.remote.url == "off" and moved.run.device == "cpu"
    with pytest.raises(TypeError, match="unknown settings: nope"):
        settings.updated(nope=1)


def test_bad_variables_are_one_line_naming_each(monkeypatch):
    from warmup.core.settings import SettingsError, from_environment

    monkeypatch.setenv("TRITON_WARMUP_LOCK_TTL_S", "-3")
    monkeypatch.setenv("TRITON_WARMUP_WORLD_SIZE", "nine")
    with pytest.raises(SettingsError) as bad:
        from_environment()
    message = str(bad.value)
    assert "\n" not in message and bad.value.__suppress_context__  # no pydantic report
    assert "TRITON_WARMUP_LOCK_TTL_S='-3'" in message and "TRITON_WARMUP_WORLD_SIZE" in message


def test_a_setting_not_given_is_refused_by_who_needs_it(monkeypatch, tmp_path):
    from warmup.core.settings import SettingsError, require

    monkeypatch.delenv("TRITON_WARMUP_MANIFEST", raising=False)
    monkeypatch.delenv("TRITON_WARMUP_VOLUME", raising=False)
    with pytest.raises(SettingsError) as missing:
        require(Settings(), ["manifest", "volume"], who="run", ways={"manifest": "--manifest"})
    assert str(missing.value) == (
        "run needs the manifest and the volume: give --manifest; TRITON_WARMUP_VOLUME"
    )
    monkeypatch.delenv("TRITON_WARMUP_WORK_DIR", raising=False)
    with pytest.raises(SettingsError) as missing:
        require(Settings(), ["manifest", "volume", "work_dir"], who="serve")
    assert str(missing.value).startswith("serve needs the manifest, the volume and the work dir")
    require(Settings(manifest=tmp_path / "m.yaml", volume=tmp_path), ["manifest"], who="run")
    monkeypatch.setenv("TRITON_WARMUP_MANIFEST", "m.yaml")  # the environment gives it too
    require(Settings(), ["manifest"], who="run")
