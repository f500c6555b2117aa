"""Bundle installs from the watched folder: deferred, installed once, or rejected."""

import signal

import pytest
from prometheus_client import CollectorRegistry

from registry import Entry, KernelConfig, RegistryError, Store, cpu_fingerprint
from registry.bundles import bundle
from registry.core import atomic
from tests.conftest import gpu_fingerprint
from tests.registry.bundles.test_bundle import _hanging_install, _models_bundle
from tests.warmup.sidecar.test_server import DEMO, make_bundle, ready_status
from warmup.core.metrics import ServeMetrics
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.core.settings import Settings
from warmup.sidecar.installs import BundleInstalls


@pytest.fixture
def settings(tmp_path):
    return Settings(volume=tmp_path / "volume", work_dir=tmp_path / "work", manifest=DEMO)


def _installs(settings):
    services = Services(settings)
    metrics = ServeMetrics(registry=CollectorRegistry())
    status = lambda: RunStatus.read(settings.paths.status_file)  # noqa: E731
    return BundleInstalls(services, services.store(), metrics, status=status)


def test_a_bundle_waits_for_a_warmup_to_record_the_nodes_fingerprint(settings, tmp_path):
    installs = _installs(settings)
    path = make_bundle(tmp_path, "good", 64)
    assert installs.install(path) == "deferred"
    ready_status(settings)
    assert installs.install(path) == "installed"
    assert [e.key["M"] for e in installs.store.entries()] == [64]


def test_the_same_bytes_are_installed_once_even_by_a_restarted_sidecar(settings, tmp_path):
    ready_status(settings)
    path = make_bundle(tmp_path, "good", 64)
    assert _installs(settings).install(path) == "installed"
    again = _installs(settings)  # a restarted sidecar: a fresh store and fresh installs
    assert again.install(path) == "installed"
    assert len(bundle.installed(again.store)) == 1


def test_a_bundle_for_another_node_is_rejected_and_a_busy_store_defers(
    settings, tmp_path, monkeypatch
):
    ready_status(settings)
    installs = _installs(settings)
    foreign = make_bundle(tmp_path, "foreign", 32, fingerprint=gpu_fingerprint())
    assert installs.install(foreign) == "rejected" and len(installs.store) == 0

    def busy(*args, **kwargs):
        raise RegistryError("Store x: write lock not acquired within 120 s.")

    monkeypatch.setattr(bundle, "install", busy)
    assert installs.install(make_bundle(tmp_path, "good", 64)) == "deferred"


def test_an_unusable_fingerprint_in_the_status_defers(settings, tmp_path):
    ready_status(settings, fingerprint={**cpu_fingerprint().to_json(), "kernel_hash": 7})
    assert _installs(settings).install(make_bundle(tmp_path, "good", 64)) == "deferred"


def test_recover_clears_a_killed_writers_stages_and_survives_a_store_it_cannot_write(
    settings, make_entry, monkeypatch, caplog
):
    installs = _installs(settings)
    installs.store.put(make_entry(m=1))
    debris = installs.store.root / f"{atomic.TEMP_PREFIX}killed"  # a killed writer's temp file
    debris.write_text("half")
    installs.recover()
    assert not debris.exists() and len(installs.store) == 1

    def unwritable(**kwargs):
        raise OSError("read-only file system")

    monkeypatch.setattr(installs.store, "recover", unwritable)
    installs.recover()
    assert "not recovered: read-only file system" in caplog.text


def _fleet_bundle(tmp_path, sequence, m):
    """The bundle 'fleet' at ``sequence``, carrying one entry for this node at ``m``,
    signed by the release key in ``tmp_path/release`` (made on the first call)."""
    from registry.trust import signing

    keys = tmp_path / "release"
    if not keys.exists():
        signing.generate(keys, "release")
    store = Store(tmp_path / f"src-{sequence}", create=True)
    config = KernelConfig.make({"BLOCK_M": 16})
    store.put(Entry.make("ag_gemm", {"M": m, "N": 32, "K": 32}, cpu_fingerprint(), config))
    out = tmp_path / f"fleet-{sequence}.tgz"
    signer = signing.SigningKey.load(keys / "release.key")
    bundle.create(
        out, name="fleet", version="1", entries=store.entries(), sequence=sequence, signer=signer
    )
    return out


def test_an_older_bundle_is_rejected_and_stays_so_after_a_restart(settings, tmp_path):
    _fleet_bundle(tmp_path, 0, 1)  # the release key
    settings = settings.updated(trusted_keys=tmp_path / "release")
    ready_status(settings)
    installs = _installs(settings)
    assert installs.install(_fleet_bundle(tmp_path, 10, 64)) == "installed"
    current = installs.store.current_generation()
    older = _fleet_bundle(tmp_path, 9, 32)
    assert installs.install(older) == "rejected"
    again = _installs(settings)  # a restarted sidecar on the same volume
    assert again.install(older) == "rejected"
    assert again.store.current_generation() == current
    assert [e.key["M"] for e in again.store.entries()] == [64]


def test_the_sidecars_start_removes_a_killed_installs_stage(settings, tmp_path):
    folder = settings.paths.volume / "inductor"
    store = settings.paths.layout.registry
    proc, stage = _hanging_install(_models_bundle(tmp_path), store, folder, tmp_path)
    installs = _installs(settings)
    installs.recover()  # a live install's stage stays
    assert stage.is_dir()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    installs.recover()
    assert not stage.exists() and not list(folder.glob(".bundle-*"))
