"""A rank's warm marker: withdrawn when its server starts, written when it declares warm."""

from __future__ import annotations

from tests.conftest import DEMO
from warmup.core.manifest import ManifestError, load_manifest
from warmup.core.results import ServerWarm
from warmup.serving.readiness import Readiness


class Guard:
    armed = False

    def arm(self) -> None:
        self.armed = True


def test_a_server_started_again_is_not_warm_until_it_says_so_again(tmp_path):
    ServerWarm(rank="3", manifest_digest="old", declared=1.0).write(tmp_path)
    said: list[str] = []
    guard = Guard()

    def flush() -> None:
        said.append(f"flushed, guard armed: {guard.armed}")

    readiness = Readiness(
        tmp_path, "3", guard=guard, manifest=lambda: load_manifest(DEMO), flush=flush
    )
    assert not ServerWarm.path(tmp_path, "3").exists()
    readiness.declare()
    assert said == ["flushed, guard armed: True"]  # armed first, then the metrics
    [warm] = ServerWarm.read_all(tmp_path)
    assert warm.rank == "3" and warm.manifest_digest == load_manifest(DEMO).digest()
    readiness.withdraw()
    assert ServerWarm.read_all(tmp_path) == []


def test_a_server_without_a_manifest_declares_its_ops_only(tmp_path):
    def unreadable():
        raise ManifestError("manifest.yaml", ["no such file"])

    readiness = Readiness(tmp_path, "0", guard=None, manifest=unreadable, flush=lambda: None)
    readiness.declare()
    [warm] = ServerWarm.read_all(tmp_path)
    assert warm.manifest_digest == "" and warm.rank == "0"
