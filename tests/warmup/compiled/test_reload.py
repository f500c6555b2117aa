"""Hot reload of compiled models (``warmup.compiled.reload``): what a bundle installed
for a declared model, at its key and this node's fingerprint, reaches the pod's cache;
a model whose key cannot be made costs only itself."""

from __future__ import annotations

from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from tests.conftest import gpu_fingerprint, settings_for
from tests.warmup.compiled.models import manifest
from warmup.compiled import reload
from warmup.compiled.key import model_key
from warmup.core.manifest import parse_manifest
from warmup.core.services import Services

FP = cpu_fingerprint()
MANIFEST = parse_manifest(
    manifest(("first", "mlp", "{batch: 1, seq: 3}"), ("second", "mlp", "{batch: 2, seq: 3}"))
)


def installed(settings, name: str) -> str:
    model = MANIFEST.model(name)
    cache = settings.paths.work_dir / f"made-{name}"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / name).write_bytes(name.encode())
    digest = model_key(model).digest
    root = settings.paths.layout.inductor
    inductor_cache.save(cache, root, model=name, key_digest=digest, key={}, fingerprint=FP)
    return inductor_cache.index_path(root, name, digest, FP).relative_to(root).as_posix()


def test_each_declared_model_a_bundle_brought_is_restored(tmp_path):
    settings = settings_for(tmp_path)
    indexes = [installed(settings, "first"), installed(settings, "second")]
    done = reload.restore_installed(Services(settings), MANIFEST.models, FP, indexes[:1])
    assert list(done) == ["first"] and done["first"].copied == 1
    assert (settings.folders.inductor_cache_dir / "fxgraph" / "first").read_bytes() == b"first"
    assert not (settings.folders.inductor_cache_dir / "fxgraph" / "second").exists()


def test_a_model_whose_key_raises_costs_only_itself(tmp_path, monkeypatch, caplog):
    settings = settings_for(tmp_path)
    indexes = [installed(settings, "first"), installed(settings, "second")]

    def key(model):
        if model.name == "first":
            raise RuntimeError("its package's __init__ raised")
        return model_key(model)

    monkeypatch.setattr(reload, "model_key", key)
    done = reload.restore_installed(Services(settings), MANIFEST.models, FP, indexes)
    assert list(done) == ["second"] and "its package's __init__ raised" in caplog.text


def test_an_index_for_another_node_is_left_on_the_volume(tmp_path):
    settings = settings_for(tmp_path)
    indexes = [installed(settings, "first")]
    assert (
        reload.restore_installed(Services(settings), MANIFEST.models, gpu_fingerprint(), indexes)
        == {}
    )
