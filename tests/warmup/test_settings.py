from pathlib import Path

import pytest
from pydantic import ValidationError

from registry import MatchPolicy
from warmup.cli import main
from warmup.settings import Settings


def test_defaults_run_the_demo_locally():
    settings = Settings()
    assert settings.volume == Path("demo-volume")
    assert settings.paths.registry == Path("demo-volume/registry")
    assert settings.lock_url == "demo-volume/locks"


def test_environment_overrides_with_the_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path))
    monkeypatch.setenv("TRITON_WARMUP_MATCH_POLICY", "same-arch")
    monkeypatch.setenv("TRITON_WARMUP_LOCK_URL", "redis://redis:6379/0")
    settings = Settings()
    assert settings.paths.triton_cache == tmp_path / "triton-cache"
    assert settings.match_policy is MatchPolicy.SAME_ARCH
    assert settings.lock_url == "redis://redis:6379/0"
    assert settings.registry_dir == tmp_path / "registry"
    monkeypatch.setenv("TRITON_WARMUP_REGISTRY_DIR", "/srv/registry")
    assert Settings().registry_dir == Path("/srv/registry")


def test_each_setting_has_one_name_and_its_default_is_resolved_once(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_WARMUP_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("TRITON_WARMUP_LOCK_URL", "")  # a chart's empty value is unset
    settings = Settings(volume=tmp_path / "volume", status_file=tmp_path / "run" / "s.json")
    assert settings.triton_cache_dir == tmp_path / "work" / "triton-cache"
    assert settings.inductor_cache_dir == tmp_path / "work" / "inductor-cache"
    assert settings.bundle_dir == tmp_path / "volume" / "bundles"
    assert settings.metrics_dir == tmp_path / "run" / "serving-metrics"  # follows the status
    assert settings.lock_url == str(tmp_path / "volume" / "locks")
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
    assert Settings().remote_url == "off"  # file leases: no remote tier
    redis = "redis://cache:6379/0"
    assert Settings(lock_url=redis).remote_url == redis
    assert Settings(lock_url=redis, remote_url="off").remote_url == "off"
    assert Settings(lock_url=redis, remote_url="").remote_url == redis  # '' is unset
    other = "rediss://other:6380/1"
    assert Settings(lock_url="/locks", remote_url=other).remote_url == other
    with pytest.raises(ValidationError, match="redis://"):
        Settings(remote_url="http://cache")


def test_where_a_process_warms_is_decided_in_one_place():
    assert Settings().device_type(gpus=0) == "cpu"  # auto: the CPU without a GPU
    assert Settings().device_type(gpus=2) == "cuda"  # auto: a GPU when there is one
    assert Settings(device="cpu").device_type(gpus=8) == "cpu"
    assert Settings(device="cuda").device_type(gpus=0) == "cuda"  # its caller refuses it


def test_a_derived_default_is_told_apart_from_a_given_value():
    settings = Settings()
    assert not settings.given("triton_cache_dir") and not settings.given("remote_url")
    assert Settings(triton_cache_dir="/cache").given("triton_cache_dir")
    assert not Settings(remote_url="").given("remote_url")  # '' is unset
    read_back = Settings.model_validate_json(settings.model_dump_json())
    assert read_back.given("remote_url") and read_back == settings  # a dump is all given


def test_the_registry_cli_installs_triton_files_in_the_volume_unless_told(tmp_path):
    from warmup.cli import build_parser

    def default_cache(settings):
        parser = build_parser(settings)
        return parser.parse_args(["registry", "bundle", "install", "b.tar.gz"]).triton_cache

    volume = tmp_path / "volume"
    assert default_cache(Settings(volume=volume)) == volume / "triton-cache"
    assert default_cache(Settings(volume=volume, triton_cache_dir="/c")) == Path("/c")


def test_an_update_derives_the_defaults_again_and_reads_no_environment(monkeypatch, tmp_path):
    settings = Settings(work_dir=tmp_path / "a", lock_url="redis://cache:6379/0")
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path / "elsewhere"))  # read once
    monkeypatch.setenv("TRITON_WARMUP_LOCK_URL", "redis://other:6379/0")  # not even for a default
    moved = settings.updated(work_dir=tmp_path / "b", lock_url="")
    assert moved.triton_cache_dir == tmp_path / "b" / "triton-cache"  # follows the new folder
    assert moved.lock_url == str(settings.paths.locks) and moved.remote_url == "off"
    assert moved.volume == settings.volume
    assert moved.updated(device="cpu").lock_url == moved.lock_url  # derived, not the variable
