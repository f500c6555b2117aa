"""``triton-warmup explain``: each factor injected into a cache family is the one named,
from the volume, a pending bundle and the remote tier; the command and the run report it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import triton

from registry import families
from registry.bundles import bundle
from registry.caches import inductor_cache, triton_cache
from registry.caches.triton_cache import Origin
from registry.core.fingerprint import MatchPolicy, cpu_fingerprint
from registry.families import Sources
from registry.families.base import Declared
from registry.remote import models as remote_models
from registry.remote import triton as remote_triton
from registry.remote.tier import RemoteTier
from registry.storage.store import Store
from tests._trust import UNSIGNED_OK
from tests.conftest import (
    DEMO,
    env_without_interpreter,
    error_line,
    gpu_fingerprint,
    settings_for,
    write_manifest,
)
from tests.registry.caches.test_triton_cache import compile_in
from tests.registry.core.test_explain import FINGERPRINT_FACTORS
from tests.registry.test_redis_outage import redis  # noqa: F401
from tests.warmup.compiled.models import manifest as models_manifest
from warmup.caches import explain
from warmup.caches import families as warm_families
from warmup.caches.explain import Host
from warmup.compiled.key import model_key
from warmup.core.manifest import load_manifest
from warmup.core.services import Services

ROOT = Path(__file__).resolve().parents[2]
FP = gpu_fingerprint().with_kernel("")
ORIGIN = Origin.of(FP, {})


def host(fp=FP, env=None, **kernel_hashes) -> Host:
    return Host(fp, Origin.of(fp, env or {}), kernel_hashes)


def predicted(family, settings, mine, bundles=(), remote=None, manifest=None):
    """The family's prediction, as ``explain`` makes it."""
    where = warm_families.scope(Services(settings), manifest)
    return families.named(family).explain(where, mine, Sources(bundles, remote))


def remote_model(remote, model, key):
    return families.named("inductor").remote_differences(remote, Declared(model, key), host())


@pytest.fixture
def server(redis):  # noqa: F811
    redis.client.flushall()
    return redis


# ---- tuned configs ------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "factor"), FINGERPRINT_FACTORS)
def test_tuned_configs_name_the_software_factor_that_differs(tmp_path, make_entry, change, factor):
    settings = settings_for(tmp_path)
    Store(settings.paths.registry_dir, create=True).put(make_entry(fp=FP.with_kernel("k" * 64)))
    mine = host(replace(FP, software=replace(FP.software, **change)), ag_gemm="k" * 64)
    got = predicted("tuned-configs", settings, mine, [], None)
    assert (got.outcome, got.factor) == ("miss", factor)
    assert predicted("tuned-configs", settings, host(ag_gemm="k" * 64), [], None).outcome == "hit"


def test_tuned_configs_name_the_gpu_the_arch_and_the_kernel_source(tmp_path, make_entry):
    settings = settings_for(tmp_path)
    Store(settings.paths.registry_dir, create=True).put(make_entry(fp=FP.with_kernel("k" * 64)))
    h100 = gpu_fingerprint("NVIDIA H100 80GB HBM3", sms=132).with_kernel("")
    assert predicted("tuned-configs", settings, host(h100, ag_gemm="k" * 64), [], None).factor == (
        "GPU model"
    )
    same_arch = settings.updated(match_policy=MatchPolicy.SAME_ARCH)
    got = predicted("tuned-configs", same_arch, host(h100, ag_gemm="k" * 64), [], None)
    assert got.outcome == "hit"  # the policy forgives another GPU of the same arch
    b200 = gpu_fingerprint("NVIDIA B200", cc="10.0").with_kernel("")
    assert predicted("tuned-configs", same_arch, host(b200, ag_gemm="k" * 64), [], None).factor == (
        "compute capability"
    )
    changed = predicted("tuned-configs", settings, host(ag_gemm="j" * 64), [], None)
    assert (changed.factor, changed.stored) == ("kernel source", "k" * 64)


def test_tuned_configs_count_a_pending_bundles_entries(tmp_path, make_entry):
    settings = settings_for(tmp_path)
    other = FP.with_kernel("k" * 64)
    other = replace(other, software=replace(other.software, driver="580.65"))
    path = tmp_path / "b.tgz"
    bundle.create(path, name="b", version="1", entries=[make_entry(fp=other)])
    got = predicted("tuned-configs", settings, host(ag_gemm="k" * 64), [bundle.verify(path)], None)
    assert (got.held, got.factor, got.stored) == (1, "driver", "580.65")


def test_a_pending_bundle_that_trust_refuses_is_not_counted(tmp_path, make_entry, caplog):
    from registry.trust import signing

    private, _ = signing.generate(tmp_path / "keys", "release")
    settings = settings_for(tmp_path, trusted_keys=tmp_path / "keys")
    settings.paths.bundle_dir.mkdir(parents=True)
    bundle.create(
        settings.paths.bundle_dir / "unsigned.tgz", name="u", version="1", entries=[make_entry()]
    )
    signed = settings.paths.bundle_dir / "signed.tgz"
    key = signing.SigningKey.load(private)
    bundle.create(signed, name="s", version="1", entries=[make_entry()], signer=key)
    found = explain._pending_bundles(settings.paths.bundle_dir, Services(settings).trust)
    assert [b.path.name for b in found] == ["signed.tgz"]
    assert any(
        "unsigned.tgz" in r.getMessage() and "unsigned" in r.getMessage() for r in caplog.records
    )


def test_tuned_configs_on_the_remote_tier_are_sampled(tmp_path, server, make_entry):
    remote = RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)
    remote.publish(make_entry(fp=gpu_fingerprint(ptxas="12.4")))
    got = predicted("tuned-configs", settings_for(tmp_path), host(ag_gemm="k" * 64), [], remote)
    assert (got.held, got.factor, got.stored) == (1, "ptxas", "12.4")


# ---- Triton's kernels and autotune results --------------------------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A real sm90 Triton cache (compiled on CPU, no GPU needed), made once."""
    cache = tmp_path_factory.mktemp("compiled")
    compile_in(cache)
    return cache


def saved(tmp_path: Path, compiled: Path, origin: Origin | None = ORIGIN):
    settings = settings_for(tmp_path)
    triton_cache.save(compiled, settings.paths.layout.triton_cache, origin)
    return settings


@pytest.mark.parametrize(
    ("change", "factor"),
    [
        ({"triton": "3.7.0"}, "Triton version"),
        ({"triton_build": "u" * 16}, "Triton build"),
        ({"compute_capability": "10.0"}, "compute capability"),
        ({"ptxas": "13.0"}, "ptxas"),
        ({"env": {"TRITON_DEFAULT_FP_FUSION": "0"}}, "env TRITON_DEFAULT_FP_FUSION"),
    ],
)
def test_triton_kernels_name_the_factor_of_their_key_that_differs(
    tmp_path, compiled, change, factor
):
    settings = saved(tmp_path, compiled)
    mine = Host(FP, replace(ORIGIN, **change))
    got = predicted("triton-kernels", settings, mine, [], None)
    assert (got.outcome, got.held, got.factor) == ("miss", 1, factor)
    assert predicted("triton-kernels", settings, Host(FP, ORIGIN)).outcome == "hit"


def test_without_a_recorded_origin_the_kernels_own_metadata_names_the_arch(tmp_path, compiled):
    settings = saved(tmp_path, compiled, origin=None)
    mine = Host(FP, replace(ORIGIN, compute_capability="10.0", triton=triton.__version__))
    got = predicted("triton-kernels", settings, mine, [], None)
    assert (got.factor, got.stored, got.mine) == ("compute capability", "9.0", "10.0")


def test_a_cache_copied_without_restore_names_the_path_its_groups_hold(tmp_path, compiled):
    settings = saved(tmp_path, compiled)
    shutil.copytree(compiled, settings.folders.triton_cache_dir)  # groups still name the old folder
    got = predicted("triton-kernels", settings, Host(FP, ORIGIN))
    assert (got.outcome, got.factor) == ("miss", "path group")
    assert str(compiled) in got.stored
    shutil.rmtree(settings.folders.triton_cache_dir)
    triton_cache.restore(settings.paths.layout.triton_cache, settings.folders.triton_cache_dir)
    assert predicted("triton-kernels", settings, Host(FP, ORIGIN)).outcome == "hit"


def test_autotune_results_are_predicted_from_their_origin_or_said_unknown(tmp_path):
    settings = settings_for(tmp_path)
    for name, origin in (("A", ORIGIN), ("B", None)):
        folder = settings.paths.layout.triton_cache / name
        folder.mkdir(parents=True)
        (folder / "fn.autotune.json").write_text('{"key": [], "configs_timings": []}')
        if origin is not None:
            triton_cache.record_origin(settings.paths.layout.triton_cache, origin, [name])
    mine = Host(FP, replace(ORIGIN, env={"TRITON_F32_DEFAULT": "ieee"}))
    got = predicted("triton-autotune", settings, mine, [], None)
    assert (got.outcome, got.held, got.factor) == ("miss", 1, "env TRITON_F32_DEFAULT")
    assert got.note == "1 of unknown origin not predicted"


def test_kernels_on_the_remote_tier_are_sampled_from_their_metadata(tmp_path, server, compiled):
    remote = RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)
    for path in compiled.rglob("*"):
        if path.is_file():
            remote_triton.publish(remote, path.parent.name, path.name, path.read_bytes())
    mine = Host(FP, replace(ORIGIN, compute_capability="8.0", triton=triton.__version__))
    got = predicted("triton-kernels", settings_for(tmp_path), mine, [], remote)
    assert (got.held, got.factor, got.stored) == (1, "compute capability", "9.0")


# ---- Inductor's artifacts -----------------------------------------------------------------


def test_a_models_artifacts_name_the_factor_or_the_changed_code(tmp_path):
    root = tmp_path / "inductor"
    cache = tmp_path / "cache"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"graph")
    inductor_cache.save(cache, root, model="mlp", key_digest="a" * 16, key={}, fingerprint=FP)
    assert inductor_cache.model_differences(root, "mlp", "a" * 16, FP) == {}
    cuda13 = replace(FP, software=replace(FP.software, cuda_runtime="13.0"))
    assert inductor_cache.model_differences(root, "mlp", "a" * 16, cuda13) == {
        "CUDA": ("13.0", "12.8")
    }
    assert list(inductor_cache.model_differences(root, "mlp", "b" * 16, FP)) == [
        "model code or shapes"
    ]
    assert inductor_cache.model_differences(root, "other", "a" * 16, FP) is None


def test_a_models_index_on_the_remote_tier_is_found_exactly_or_its_factor_named(tmp_path, server):
    remote = RemoteTier(server.url, timeout_s=0.5, trust=UNSIGNED_OK)
    root, cache = tmp_path / "inductor", tmp_path / "cache"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"graph")
    for n in range(60):  # more indexes of the model than explain samples
        fp = replace(FP, software=replace(FP.software, driver=f"5{n:02d}.1"))
        inductor_cache.save(cache, root, model="mlp", key_digest="a" * 16, key={}, fingerprint=fp)
        remote_models.publish(remote, root, model="mlp", key_digest="a" * 16, fingerprint=fp)
    assert remote_model(remote, "mlp", "a" * 16)["driver"][0] == "570.86"
    inductor_cache.save(cache, root, model="mlp", key_digest="a" * 16, key={}, fingerprint=FP)
    remote_models.publish(remote, root, model="mlp", key_digest="a" * 16, fingerprint=FP)
    assert remote_model(remote, "mlp", "a" * 16) == {}
    assert remote_model(remote, "mlp", "b" * 16) == {
        "model code or shapes": ("b" * 12, "other keys")
    }
    assert remote_model(remote, "other", "a" * 16) is None


def test_a_declared_model_is_looked_up_at_its_own_key(tmp_path):
    text = models_manifest(("mlp", "mlp", "{batch: [2], seq: [4]}"))
    path = write_manifest(tmp_path / "m.yaml", text)
    settings, manifest = settings_for(tmp_path, manifest=path), load_manifest(path)
    got = predicted("inductor", settings, host(cpu_fingerprint()), [], None, manifest)
    assert (got.outcome, got.missing) == ("miss", 1)
    cache = tmp_path / "cache"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "entry").write_bytes(b"graph")
    key = model_key(manifest.models[0]).digest
    other = replace(cpu_fingerprint(), software=replace(cpu_fingerprint().software, torch="9"))
    inductor_cache.save(
        cache,
        settings.paths.layout.inductor,
        model="mlp",
        key_digest=key,
        key={},
        fingerprint=other,
    )
    got = predicted("inductor", settings, host(cpu_fingerprint()), [], None, manifest)
    assert (got.outcome, got.factor, got.stored) == ("miss", "torch", "9")


# ---- the command and the run ------------------------------------------------------------


def test_the_command_prints_one_line_per_family_and_json_for_machines(tmp_path, make_entry):
    settings = settings_for(tmp_path)
    Store(settings.paths.registry_dir, create=True).put(
        make_entry(fp=gpu_fingerprint(driver="1.0"))
    )
    env = {
        "TRITON_WARMUP_VOLUME": str(settings.paths.volume),
        "TRITON_WARMUP_WORK_DIR": str(tmp_path),
        "TRITON_WARMUP_MANIFEST": str(ROOT / "examples" / "demo.yaml"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "warmup", "explain", "--device", "cpu", "--json"],
        cwd=ROOT,
        env=env_without_interpreter(**env, TRITON_WARMUP_REMOTE_URL="off"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    predictions = json.loads(done.stdout)["predictions"]
    assert [p["family"] for p in predictions] == warm_families.names()
    tuned = predictions[0]
    assert (tuned["outcome"], tuned["stored"]) == ("miss", "2.11.0")  # the CPU's torch differs
    assert tuned["line"].startswith("tuned-configs: MISS: 0 of 1 stored usable; torch differs")


def _explain(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    from warmup.cli import main

    monkeypatch.setenv("TRITON_WARMUP_REMOTE_URL", "off")
    manifest = [] if "--manifest" in args else ["--manifest", str(DEMO)]
    code = main(["explain", "--device", "cpu", *manifest, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_missing_or_unreadable_manifest_is_bad_input(isolated, capsys, monkeypatch):
    (isolated / "volume").mkdir()
    code, out, err = _explain(capsys, monkeypatch, "--manifest", "missing.yaml")
    assert code == 2 and out == ""
    assert "missing.yaml: cannot read" in error_line(err)
    (isolated / "folder.yaml").mkdir()
    code, out, err = _explain(capsys, monkeypatch, "--manifest", "folder.yaml")
    assert code == 2 and "folder.yaml" in error_line(err)


@pytest.mark.parametrize("kind", ["missing", "file", "not a volume"])
def test_a_mistyped_volume_is_warned_of_and_left_as_it_is(isolated, capsys, monkeypatch, kind):
    volume = isolated / "volumee"
    if kind == "file":
        volume.write_text("x")
    elif kind == "not a volume":
        (volume / "photos").mkdir(parents=True)
    before = sorted(p.relative_to(isolated) for p in isolated.rglob("*"))
    code, out, err = _explain(capsys, monkeypatch, "--volume", str(volume))
    assert code == 0 and out.count("EMPTY") == len(warm_families.names())  # predicted all the same
    (warning,) = err.strip().splitlines()
    assert warning.startswith(f"triton-warmup: warning: volume '{volume}' ")
    assert {"missing": "does not exist", "file": "not a folder", "not a volume": "holds none"}[
        kind
    ] in warning
    assert sorted(p.relative_to(isolated) for p in isolated.rglob("*")) == before  # nothing made


def test_a_volume_holding_a_store_gets_no_warning(isolated, capsys, monkeypatch, make_entry):
    Store(isolated / "volume" / "registry", create=True).put(make_entry())
    code, out, err = _explain(capsys, monkeypatch)
    assert code == 0 and err == "" and out.startswith("tuned-configs: MISS")
