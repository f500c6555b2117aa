"""Rank 0's restore and save of a compiled model (``warmup.compiled.warm``) with the
registry's remote tier (a real redis-server) behind the volume."""

from __future__ import annotations

from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteTier
from tests._trust import UNSIGNED_OK
from tests.conftest import settings_for
from tests.registry.conftest import server  # noqa: F401  (a fixture)
from tests.registry.families.test_bundle_indexed import FILES
from tests.registry.test_redis_outage import redis  # noqa: F401  (a module fixture)
from warmup.compiled import warm
from warmup.compiled.key import ModelKey
from warmup.core.services import Services

FP = cpu_fingerprint()


def tier(url: str) -> RemoteTier:
    return RemoteTier(url, timeout_s=0.5, retry_after_s=30.0, trust=UNSIGNED_OK)


def test_the_warm_restores_from_the_remote_tier_and_publishes_what_it_stores(
    tmp_path,
    server,  # noqa: F811
):
    """Rank 0's restore and save (``warmup.compiled.warm``) with the tier behind the
    volume: pod A stores and publishes; pod B, on another volume, restores through it."""
    key = ModelKey({"k": 1})
    model = type("Model", (), {"name": "mlp"})()
    a, b = settings_for(tmp_path / "a"), settings_for(tmp_path / "b")
    for rel, data in FILES.items():
        (a.folders.inductor_cache_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (a.folders.inductor_cache_dir / rel).write_bytes(data)
    stored = warm._Artifacts(model, key, Services(a, run=True), FP, tier(server.url))
    assert stored.save() == {"stored_artifacts": len(FILES)}
    on_b = Services(b, run=True)
    assert warm._Artifacts(model, key, on_b, FP, None).restore()["restore"].startswith("miss")
    assert warm._Artifacts(model, key, on_b, FP, tier(server.url)).restore() == {"restore": "hit"}
    pod = b.folders.inductor_cache_dir
    assert {
        p.relative_to(pod).as_posix(): p.read_bytes() for p in pod.rglob("*") if p.is_file()
    } == FILES
