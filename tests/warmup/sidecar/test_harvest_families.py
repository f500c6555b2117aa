"""Every family's part of the harvest, naming none: what a new file is, a file taken
one by one (checked, counted under its kind's label, shared, once), the watched
folders saved whole."""

from __future__ import annotations

import logging
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry

from registry import families
from registry.families import Family
from registry.families.file_harvest import FileLimits, Harvested, Upload
from registry.remote import triton as remote_triton
from registry.storage.store import Store
from tests.conftest import gpu_fingerprint, settings_for
from tests.registry.families.conftest import fake_kernel
from warmup.compiled import learned
from warmup.core.metrics import ServeMetrics
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.sidecar.harvest_families import FamilyHarvest
from warmup.sidecar.harvest_host import HarvestHost
from warmup.sidecar.harvest_publish import Publisher
from warmup.sidecar.harvest_queue import FOLDERS

HOST = HarvestHost(gpu_fingerprint(), {})


class Tier:
    """A remote tier that takes every file (its Triton layout replaced by a list)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def publish(self, remote: object, key: str, name: str, data: bytes) -> bool:
        assert remote is self
        self.sent.append(name)
        return True


@pytest.fixture
def pod(tmp_path, monkeypatch):
    settings = settings_for(tmp_path)
    tier = Tier()
    monkeypatch.setattr(remote_triton, "publish", tier.publish)
    publisher = Publisher(tier)  # type: ignore[arg-type]
    harvest = FamilyHarvest(
        Services(settings),
        ServeMetrics(CollectorRegistry()),
        publisher=publisher,
        store=lambda: Store(settings.paths.registry_dir, create=True),
        limits=FileLimits(),
    )
    return settings, harvest, tier


def counted(harvest: FamilyHarvest, label: str, result: str) -> float:
    value = harvest.metrics.registry.get_sample_value(
        "triton_warmup_harvest_entries_total", {"family": label, "result": result}
    )
    return value or 0.0


def test_what_a_new_file_is(pod):
    settings, harvest, _ = pod
    triton, inductor = (
        settings.folders.triton_cache_dir,
        settings.folders.inductor_cache_dir,
    )
    assert harvest.file_folders == [triton]
    assert harvest.kind(triton / "K" / "__grp__k.json") == "kernel"
    assert harvest.kind(triton / "K" / "fn.autotune.json") == "autotune"
    assert harvest.kind(triton / "K" / "launcher.so") == "stub"
    assert harvest.kind(triton / "K" / "k.cubin") is None  # its family's, not a folder's
    assert harvest.kind(inductor / "fxgraph" / "abc") == FOLDERS
    assert harvest.kind(inductor / "fxgraph" / ".tmp-abc") is None
    assert harvest.kind(settings.paths.metrics_dir / f"{learned.PREFIX}mlp.json") == FOLDERS
    assert harvest.kind(settings.paths.metrics_dir / "other.json") is None
    assert harvest.kind(settings.paths.volume / "elsewhere") is None


def test_a_file_is_harvested_counted_under_its_kinds_label_shared_and_seen_once(pod):
    settings, harvest, tier = pod
    group = fake_kernel(settings.folders.triton_cache_dir)
    assert harvest.file("kernel", group, HOST) == "harvested"
    assert counted(harvest, "triton-kernels", "harvested") == 1
    size = harvest.metrics.registry.get_sample_value(
        "triton_warmup_harvest_bytes_total", {"family": "triton-kernels"}
    )
    assert size and size > 0
    assert tier.sent == ["k.cubin", "k.json", "__grp__k.json"]  # through the publisher
    assert harvest.file("kernel", group, HOST) == "seen"
    assert counted(harvest, "triton-kernels", "harvested") == 1
    assert tier.sent == ["k.cubin", "k.json", "__grp__k.json"]


def test_a_refused_file_is_one_log_line_and_counted(pod, caplog):
    settings, harvest, tier = pod
    caplog.set_level(logging.WARNING)
    group = fake_kernel(settings.folders.triton_cache_dir, arch=80)
    assert harvest.file("kernel", group, HOST) == "refused"
    assert counted(harvest, "triton-kernels", "refused") == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("harvest: refused kernel KEYABC/__grp__k.json: compiled for")
    assert not settings.paths.layout.triton_cache.exists() and tier.sent == []


def test_a_dropped_entry_is_counted_under_its_kinds_label(pod):
    _, harvest, _ = pod
    harvest.dropped("autotune")
    harvest.dropped("stub")
    assert counted(harvest, "triton-autotunes", "dropped") == 1
    assert counted(harvest, "triton-stubs", "dropped") == 1
    assert harvest.takes_one_by_one("kernel") and not harvest.takes_one_by_one(FOLDERS)


def test_the_watched_folders_with_nothing_new_are_deduplicated(pod):
    settings, harvest, _ = pod
    ready = RunStatus(
        state="ready",
        manifest_digest="x",
        started=0.0,
        world_size=1,
        fingerprint=HOST.fingerprint.to_json(),
    )
    assert settings.folders.inductor_cache_dir in harvest.folders
    assert harvest.watched(ready, HOST) == "deduplicated"


class Notes(Family):
    """A family that takes ``*.note`` files of one folder one by one."""

    name = "notes"
    file_kinds = MappingProxyType({"note": "notes-files"})

    def file_folders(self, scope):
        return [scope.volume.root.parent / "notes"]

    def file_kind(self, scope, path):
        return "note" if path.suffix == ".note" else None

    def harvest_file(self, scope, kind, path, limits):
        data = path.read_bytes()
        return Harvested("harvested", len(data), (Upload("notes", path.name, data, sent),))


def sent(remote, upload) -> bool:
    remote.sent.append(upload.name)
    return True


def test_a_new_family_that_takes_files_is_harvested_by_its_module_alone(tmp_path, monkeypatch):
    every = families.every()
    monkeypatch.setattr(families, "every", lambda: (*every, Notes()))
    settings = settings_for(tmp_path)
    tier = Tier()
    harvest = FamilyHarvest(
        Services(settings),
        ServeMetrics(CollectorRegistry()),
        publisher=Publisher(tier),  # type: ignore[arg-type]
        store=lambda: Store(settings.paths.registry_dir, create=True),
        limits=FileLimits(),
    )
    note = settings.paths.volume.parent / "notes" / "a.note"
    note.parent.mkdir(parents=True)
    note.write_bytes(b"hello")
    assert note.parent in harvest.file_folders
    assert harvest.kind(note) == "note" and harvest.kind(note.with_suffix(".txt")) is None
    assert harvest.file("note", note, HOST) == "harvested"
    assert counted(harvest, "notes-files", "harvested") == 1 and tier.sent == ["a.note"]
