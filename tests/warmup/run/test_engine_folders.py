"""A pod of declared folders alone (a stock engine's caches: no kernel shape, no model):
the init container starts no rank; the first pod of a kind of host detects and records
it, so that the harvest keeps what the server writes and the next pod restores it."""

from registry.core.fingerprint import Fingerprint
from tests.conftest import settings_for, write_manifest
from warmup.caches import families
from warmup.core.manifest import load_manifest
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.run.launch import run


def _engine_pod(tmp_path, pod: str):
    engine = tmp_path / pod / "engine"
    engine.mkdir(parents=True)
    text = f'version: 1\ncaches:\n  - {{name: vllm, path: "{engine}", key: "qwen img tp2"}}\n'
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


def test_a_manifest_of_folders_alone_needs_no_world_size(tmp_path):
    settings, manifest, _ = _engine_pod(tmp_path, "pod")
    assert not manifest.world_sizes()
    manifest.require_world(4)  # any pod size restores the folders
    assert run(settings.updated(world_size=4), manifest).ready
