"""The whole path of a compiled model on CPU (Inductor's C++ backend): declared, warmed
and stored by one pod, restored by a pod whose volume, work folder and home are
elsewhere, then served by a fresh process at yet another path with nothing compiled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import settings_for, wait_for, write_manifest
from tests.warmup.compiled.models import manifest
from warmup.cli import main
from warmup.core.manifest import load_manifest
from warmup.core.services import Services
from warmup.run.launch import run

ROOT = Path(__file__).resolve().parents[3]
MLP = manifest(("mlp", "mlp", "{batch: [1, 2], seq: 3}"))

pytestmark = pytest.mark.slow


def warm(root: Path, text: str, monkeypatch: pytest.MonkeyPatch, **extra):
    root.mkdir(parents=True, exist_ok=True)
    path = write_manifest(root / "manifest.yaml", text)
    monkeypatch.setenv("HOME", str(root / "home"))  # the rank processes inherit it
    settings = settings_for(root, manifest=path, **extra)
    return settings, run(settings, load_manifest(path))


def serve(work: Path, manifest: Path, name: str, *extra: dict, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.warmup.compiled._server", name, *map(json.dumps, extra)],
        cwd=ROOT,
        env={
            **os.environ,
            "HOME": str(work.parent / "home"),
            "TRITON_WARMUP_WORK_DIR": str(work),
            "TRITON_WARMUP_MANIFEST": str(manifest),
            "TRITON_WARMUP_VOLUME": str(work.parent / "volume"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def carry(source: Path, target: Path, out: Path) -> None:
    """``registry bundle create`` on one volume, signed by a release key, ``bundle
    install`` on the other, which trusts only that key (the default path: signed)."""
    from registry.trust import signing

    keys = out.parent / "release-keys"
    private, _ = signing.generate(keys, "release")
    create = ["bundle", "create", str(out), "--name", "models", "--version", "1",
              "--sign-key", str(private)]  # fmt: skip
    install = [
        "bundle",
        "install",
        str(out),
        "--fingerprint",
        "detect",
        "--trusted-keys",
        str(keys),
    ]
    for volume, command in ((source, create), (target, install)):
        store = ["registry", "--store", str(volume / "registry"), "--create-store"]
        assert main([*store, *command, "--inductor", str(volume / "inductor")]) == 0


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """Pod A warms and stores; its models travel by bundle to pod B's volume (another
    path, a new work folder and home, A gone), which restores them; the pod's folder is
    then moved once more (C), as a server container sees it at a mount path of its own."""
    root = tmp_path_factory.mktemp("pods")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _, first = warm(root / "a", MLP, monkeypatch)
        carry(root / "a" / "volume", root / "b" / "volume", root / "models.tgz")
        shutil.rmtree(root / "a")
        _, second = warm(root / "b", MLP, monkeypatch)
    shutil.copytree(root / "b", root / "c", symlinks=True)
    shutil.rmtree(root / "b")
    return first, second, root / "c"


def test_a_model_warmed_by_one_pod_is_restored_by_another_at_another_path(pods):
    first, second, _ = pods
    assert first.ready, first.failures
    [model] = first.models
    assert model.phase == "warm" and len(model.shapes) == 2
    assert model.counts["inductor_compiles"] == 2 and model.stored_artifacts > 0
    assert model.restore.startswith("miss: no artifacts of model mlp")
    assert second.ready, second.failures
    [model] = second.models
    assert model.restore == "hit"
    assert model.counts["inductor_compiles"] == 0 and model.counts["fxgraph_hits"] == 2


def test_the_server_at_yet_another_path_compiles_nothing(pods):
    served = serve(pods[2] / "work", pods[2] / "manifest.yaml", "mlp")
    assert served["error"] is None and served["guarded"] == {}
    assert not any(served["counts"].values()), served["counts"]  # Dynamo's too: primed
    assert served["primed"] == "restored"  # FX-graph hits only, from the restored cache


def test_a_shape_outside_the_manifest_is_counted_per_model_and_refused_when_strict(pods):
    work, manifest, unlisted = pods[2] / "work", pods[2] / "manifest.yaml", {"batch": 5, "seq": 3}
    counted = serve(work, manifest, "mlp", unlisted)
    assert counted["error"] is None
    assert counted["guarded"]["mlp/inductor_compiles"] == 1
    assert counted["guarded"]["mlp/dynamo_frames"] >= 1
    strict = serve(work, manifest, "mlp", unlisted, TRITON_WARMUP_COMPILE_GUARD="strict")
    assert strict["error"].startswith("RequestCompileError: model 'mlp'")
    # the first server left batch 5's graph in the pod's cache: a Dynamo compile only
    assert set(strict["guarded"]) == {"mlp/dynamo_frames"}


# a kernel entry beside the model: its ranks must start (a user function, cheap on CPU)
WITH_A_KERNEL = MLP.replace(
    "version: 1\n",
    "version: 1\nentries:\n  - {kernel: 'tests.warmup.user_functions:record_call', "
    "dtype: fp32, world_size: 1, shapes: [{M: 8, N: 8, K: 8}]}\n",
)


def test_a_first_pod_leaves_its_models_to_the_server_and_the_next_pod_is_a_full_hit(
    tmp_path, monkeypatch
):
    """``models_on_miss=server`` with a kernel entry: the first pod's ranks tune, and
    compile no model (it is deferred); its server compiles once while priming, the
    sidecar's harvest stores what it compiled; the next pod's init is a full hit, and
    its server compiles nothing."""
    from prometheus_client import CollectorRegistry

    from warmup.core.metrics import ServeMetrics
    from warmup.sidecar.harvest import Harvester

    monkeypatch.setenv("TEST_USER_LOG", str(tmp_path / "calls.jsonl"))
    settings, first = warm(tmp_path, WITH_A_KERNEL, monkeypatch, models_on_miss="server")
    assert "rank_start" in first.phases  # the kernel entry's ranks ran
    assert first.ready and not first.full_hit, first.failures
    [model] = first.models
    assert model.phase == "deferred" and model.counts == {}  # nothing built or run here
    assert model.restore.startswith("miss: no artifacts of model mlp")
    served = serve(settings.paths.work_dir, settings.paths.manifest, "mlp")
    assert served["primed"] == "compiled"
    assert (
        Harvester(Services(settings), ServeMetrics(CollectorRegistry())).harvest(
            "inductor", settings.folders.inductor_cache_dir
        )
        == "harvested"
    )
    nxt = settings.updated(work_dir=tmp_path / "next-pod")
    status = run(nxt, load_manifest(settings.paths.manifest))
    assert status.full_hit and [m.phase for m in status.models] == ["restored"]
    assert serve(nxt.paths.work_dir, settings.paths.manifest, "mlp")["primed"] == "restored"


def test_a_first_pod_of_models_only_starts_no_rank_and_its_server_tells_the_host(
    tmp_path, monkeypatch
):
    """Models only, ``models_on_miss=server``, a host never recorded: the init starts no
    rank (nothing to detect the fingerprint with); the server, which compiled, writes
    what it detected beside its metrics; the harvest stores its artifacts under it and
    records the host under the init's probe; the next pod's init is a full hit."""
    from prometheus_client import CollectorRegistry

    from registry.storage import hosts
    from warmup.core.metrics import ServeMetrics
    from warmup.core.results import RankHost
    from warmup.sidecar import harvest_queue
    from warmup.sidecar.harvest import Harvester

    settings, first = warm(tmp_path, MLP, monkeypatch, models_on_miss="server")
    assert first.ready and first.fingerprint is None and first.probe, first.failures
    assert set(first.phases) == {"imports", "restore"}  # no rank was started
    assert [m.phase for m in first.models] == ["deferred"]
    harvester = Harvester(Services(settings), ServeMetrics(CollectorRegistry()))
    assert harvester.harvest("inductor", settings.folders.inductor_cache_dir) == "waiting"
    monkeypatch.setattr(harvest_queue, "INDUCTOR_QUIET_S", 0.5)
    harvester.start()  # the sidecar's: it hears what the server compiles as it does
    try:
        assert (
            serve(settings.paths.work_dir, settings.paths.manifest, "mlp")["primed"] == "compiled"
        )
        told = RankHost.read(settings.paths.metrics_dir)
        assert told is not None and told.fingerprint["hardware"]["gpu_name"] == "cpu"
        probe = hosts.Probe.from_json(first.probe)
        assert wait_for(lambda: hosts.read_record(settings.paths.layout.hosts, probe), timeout=60)
    finally:
        harvester.stop()
    assert (
        hosts.read_record(settings.paths.layout.hosts, probe).fingerprint.to_json()
        == told.fingerprint
    )
    nxt = settings.updated(work_dir=tmp_path / "next-pod")
    status = run(nxt, load_manifest(settings.paths.manifest))
    assert status.full_hit and [m.phase for m in status.models] == ["restored"]
    assert serve(nxt.paths.work_dir, settings.paths.manifest, "mlp")["primed"] == "restored"
