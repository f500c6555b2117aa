"""A pod of declared folders alone (a stock engine's caches: no kernel shape, no model):
the init container starts no rank; the first pod of a kind of host detects and records
it, so that the harvest keeps what the server writes and the next pod restores it."""

import dataclasses
import shutil

from registry.core.fingerprint import Fingerprint, cpu_fingerprint
from registry.families.declared import FAMILY as DECLARED
from registry.storage import hosts
from registry.storage.hosts import HostRecord
from tests.conftest import settings_for, write_manifest
from warmup.caches import families
from warmup.core.manifest import load_manifest
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.run.launch import run


def _engine_pod(tmp_path, pod: str):
    engine = tmp_path / "engine"  # the same path in every pod, as the chart mounts it
    shutil.rmtree(engine, ignore_errors=True)  # a new pod's is empty
    engine.mkdir()
    text = (
        f'version: 1\ncaches:\n  - {{name: vllm, path: "{engine}", key: "qwen img tp2", '
        "engine: vllm}\n"
    )
    manifest = write_manifest(tmp_path / f"{pod}.yaml", text)
    settings = settings_for(
        tmp_path, manifest=manifest, work_dir=tmp_path / pod / "work", allow_unsigned=True
    )
    settings.paths.volume.mkdir(exist_ok=True)
    return settings, load_manifest(manifest), engine


def test_the_first_engine_pod_records_its_host_and_the_next_restores_what_it_wrote(tmp_path):
    settings, manifest, engine = _engine_pod(tmp_path, "first")
    status = run(settings, manifest)
    assert status.ready and not status.shapes and status.fingerprint is not None
    assert not (settings.paths.work_dir / "run").exists()  # no rank started
    # the server writes its cache; the sidecar's harvest saves it under the status's host
    (engine / "graph.bin").write_bytes(b"compiled by the engine")
    written = RunStatus.read(settings.paths.status_file)
    assert written is not None and written.fingerprint is not None
    host = Fingerprint.from_json(written.fingerprint)
    families.save(families.scope(Services(settings), manifest, fingerprint=host))

    settings, manifest, engine = _engine_pod(tmp_path, "second")  # a new pod, same volume
    status = run(settings, manifest)
    assert status.ready and status.full_hit
    assert (engine / "graph.bin").read_bytes() == b"compiled by the engine"


def test_the_harvest_records_the_init_containers_engine_key_not_its_own(tmp_path, monkeypatch):
    # the server's image sets a VLLM_* variable that the sidecar's image does not have
    monkeypatch.setenv("VLLM_USAGE_SOURCE", "production-docker-image")
    settings, manifest, engine = _engine_pod(tmp_path, "first")
    status = run(settings, manifest)
    assert status.engine_keys["vllm"]["env"]["VLLM_USAGE_SOURCE"] == "production-docker-image"
    (engine / "graph.bin").write_bytes(b"compiled by the engine")
    host = Fingerprint.from_json(status.fingerprint or {})
    sidecar = families.scope(  # as the harvest makes it: its own environment lacks the variable
        Services(settings), manifest, fingerprint=host, env={}, engine_keys=status.engine_keys
    )
    families.save(sidecar)
    settings, manifest, _ = _engine_pod(tmp_path, "second")
    here = families.scope(Services(settings), manifest, fingerprint=host)  # the next init's
    (folder,) = here.folders
    assert DECLARED.will_miss(here, folder, DECLARED.host(here)) == ({}, "")
    without = families.scope(Services(settings), manifest, fingerprint=host, env={})
    assert "VLLM_USAGE_SOURCE" in DECLARED.will_miss(without, without.folders[0], host)[1]


def test_a_manifest_of_folders_alone_needs_no_world_size(tmp_path):
    settings, manifest, _ = _engine_pod(tmp_path, "pod")
    assert not manifest.world_sizes()
    manifest.require_world(4)  # any pod size restores the folders
    assert run(settings.updated(world_size=4), manifest).ready


def test_an_engine_pod_on_an_ambiguous_host_detects_its_own(tmp_path):
    settings, manifest, _ = _engine_pod(tmp_path, "pod")
    first = run(settings, manifest)  # records this host under its probe
    assert first.probe is not None
    probe = hosts.Probe.from_json(first.probe)
    mine = cpu_fingerprint().with_kernel("")
    other = dataclasses.replace(mine, software=dataclasses.replace(mine.software, torch="0.0"))
    # hosts of this probe detected different fingerprints: the record names neither
    hosts.write_record(
        settings.paths.layout.hosts, probe, HostRecord(probe.to_json(), other, ambiguous=True)
    )
    settings, manifest, _ = _engine_pod(tmp_path, "next")
    status = run(settings, manifest)
    assert status.fingerprint is not None
    assert Fingerprint.from_json(status.fingerprint).digest() == mine.digest()
