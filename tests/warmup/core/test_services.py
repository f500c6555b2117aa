import pytest

from registry.core.errors import RegistryError
from registry.core.volume import MissingFolder, Volume
from registry.locks.file_lease import FileLeaseBackend
from registry.trust.signing import KeyFileError
from warmup.core.services import Services, existing_volume
from warmup.core.settings import Settings


def test_services_are_made_from_the_settings_once_and_kept(tmp_path):
    services = Services(Settings(volume=tmp_path / "v", work_dir=tmp_path / "w"), run=True)
    assert services.volume == Volume(tmp_path / "v")
    assert services.trust is services.trust  # made once, on first use
    assert services.locks is services.locks
    assert isinstance(services.locks, FileLeaseBackend)
    assert services.locks.folder == tmp_path / "v" / "locks"
    assert services.remote is None  # file leases: no remote tier
    store = services.store()
    assert store.root == tmp_path / "v" / "registry" and store.lock_timeout == 1800.0
    assert Services(services.settings, check_interval=1.0).store().check_interval == 1.0
    assert Services(services.settings).store().lock_timeout != 1800.0  # the store's own


def test_a_run_that_falls_back_gets_services_of_its_own(tmp_path):
    services = Services(Settings(volume=tmp_path, lock_url="redis://nobody:1/0"), run=True)
    fallback = services.with_settings(services.settings.updated(lock_url=""))
    assert fallback.run and fallback.locks.folder == tmp_path / "locks"  # type: ignore[attr-defined]
    assert fallback.settings.remote.url == "off"
    assert services.settings.locks.url == "redis://nobody:1/0"  # the first kept as they were


def test_a_service_that_cannot_be_made_fails_where_it_is_used(tmp_path, caplog):
    services = Services(Settings(volume=tmp_path, trusted_keys=tmp_path / "typo"))
    assert services.volume.root == tmp_path  # the rest is still there
    with pytest.raises(KeyFileError):
        _ = services.trust
    bad = Services(Settings(volume=tmp_path, remote_url="redis://r:6379/0", trusted_keys="/x"))
    with pytest.raises(RegistryError):  # the tier checks what it reads with the trust
        _ = bad.remote
    assert bad.remote_or_none("harvest: no remote tier") is None
    assert "harvest: no remote tier" in caplog.text


def test_the_volume_is_checked_and_made_only_when_asked(tmp_path):
    missing = Settings(volume=tmp_path / "nope")
    with pytest.raises(MissingFolder, match="--create-volume"):
        existing_volume(missing)
    with pytest.raises(MissingFolder, match="Settings"):
        existing_volume(missing, "check Settings(volume=...)")
    assert existing_volume(missing.updated(create_volume=True)) == tmp_path / "nope"
    assert (tmp_path / "nope").is_dir()


def test_the_remote_tier_remembers_what_it_has_seen_on_the_volume(tmp_path):
    from registry.remote.freshness import FILE_NAME, Freshness
    from registry.trust.remote_signature import Opened

    Freshness(tmp_path / FILE_NAME, save_every_s=0).note("k", "", Opened(b"x", 7, vouched=True))
    remote = Services(Settings(volume=tmp_path, remote_url="redis://r:6379/0")).remote
    assert remote is not None and remote.freshness.path == tmp_path / FILE_NAME
    assert remote.freshness.newest("k") == 7  # a restarted pod refuses what it refused before


def test_the_remote_tiers_max_age_comes_from_the_trust_settings(tmp_path, monkeypatch):
    unbounded = Services(Settings(volume=tmp_path, remote_url="redis://r:6379/0")).remote
    assert unbounded is not None and unbounded.freshness.max_age_s is None
    monkeypatch.setenv("TRITON_WARMUP_REMOTE_MAX_AGE_S", "86400")
    aged = Services(Settings(volume=tmp_path, remote_url="redis://r:6379/0")).remote
    assert aged is not None and aged.freshness.max_age_s == 86400
    with pytest.raises(ValueError, match="greater than 0"):
        Settings(remote_max_age_s=0)
