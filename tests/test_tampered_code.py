"""Tampered code never runs: a generated Inductor module, a cubin and a launcher ``.so``
that write a marker file when run or loaded, carried by a bundle (the CLI's install and
the sidecar's watcher) or by the Redis tier, with trust configured. Each path is also
driven without trust, where the same payload does write the marker: the test can fail.
"""

from __future__ import annotations

import ctypes
import itertools
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

from registry import Store
from registry.bundles import bundle
from registry.bundles import signature as bundle_signature
from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteTier
from registry.trust import signing
from tests._trust import UNSIGNED_OK
from tests.conftest import wait_for
from tests.registry._bundles import refused
from tests.registry.test_redis_outage import redis  # noqa: F401  (a module fixture)

FP = cpu_fingerprint()
MODEL, KEY = "mlp", "0123456789abcdef"
HASH = "A" * 52  # a Triton cache key folder
C_PAYLOAD = r"""
#include <stdio.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fputs("so\n", f); fclose(f); }
}
"""


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "MARKER"


def build_payload(work: Path, marker: Path) -> dict[str, bytes]:
    """The attacker's files, each writing to ``marker`` when run: a module, a launcher
    .so (built in ``work`` with cc), a cubin."""
    src = work / "payload.c"
    src.write_text(C_PAYLOAD % marker)
    so = work / "payload.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    module = f"import pathlib\nwith open({str(marker)!r}, 'a') as f:\n    f.write('module\\n')\n"
    return {
        "module": module.encode(),
        "so": so.read_bytes(),
        "cubin": b"\x7fELF tampered cubin " + str(marker).encode(),
    }


@pytest.fixture
def payload(tmp_path, marker):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the .so payload")
    return build_payload(tmp_path, marker)


def _sources(root: Path, files: dict[str, bytes]) -> tuple[Path, Path]:
    """A compiled models' family (a generated module, a compiled kernel's .so) and a
    Triton cache (a launcher .so, a cubin) holding ``files``."""
    cache = root / "inductor-cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "cabcdef.py").write_bytes(files["module"])
    (cache / "ab" / "cabcdef.so").write_bytes(files["so"])
    family = root / "inductor"
    inductor_cache.save(cache, family, model=MODEL, key_digest=KEY, key={}, fingerprint=FP)
    triton = root / "triton-cache"
    (triton / HASH).mkdir(parents=True)
    (triton / HASH / "__triton_launcher.so").write_bytes(files["so"])
    (triton / HASH / "kernel.cubin").write_bytes(files["cubin"])
    return family, triton


def _bundle(root: Path, files: dict[str, bytes], signer=None) -> Path:
    family, triton = _sources(root, files)
    out = root / "b.tgz"
    bundle.create(
        out,
        name="m",
        version="1",
        entries=[],
        signer=signer,
        roots={"triton-kernels": triton, "inductor": family},
    )
    return out


def hostile_bundles(tmp_path, payload, trusted):
    """The payload as a bundle: unsigned, signed by a stranger, and behind the
    signature of an honest bundle (its parts rehashed to agree: the issue's attack)."""
    honest = {"module": b"x = 1\n", "so": b"\x7fELF honest", "cubin": b"\x7fELF honest cubin"}
    signed = _bundle(tmp_path / "honest", honest, signer=trusted)
    unsigned = _bundle(tmp_path / "unsigned", payload)
    private, _ = signing.generate(tmp_path / "stranger-keys", "stranger")
    foreign = _bundle(tmp_path / "foreign", payload, signer=signing.SigningKey.load(private))
    signature, _ = bundle_signature.first_member(signed, bundle.MANIFEST, 2**23)
    assert signature is not None
    tampered = tmp_path / "tampered.tgz"
    bundle_signature.write_signed(unsigned, tampered, signature)
    return {"unsigned": unsigned, "foreign": foreign, "tampered": tampered}


def run_everything(family: Path, triton: Path, work: Path) -> None:
    """What a server does with the caches: import the restored modules, load the .so
    files; a cubin is code for the GPU: loading it here means finding it in the cache."""
    restored = work / f"restored-{len(list(work.glob('restored-*')))}"
    inductor_cache.restore(family, restored, model=MODEL, key_digest=KEY, fingerprint=FP)
    for path in sorted(restored.rglob("*.py")):
        runpy.run_path(str(path))
    for path in sorted([*triton.rglob("*.so"), *restored.rglob("*.so")]):
        ctypes.CDLL(str(path))
    for path in sorted(triton.rglob("*.cubin")):
        if b"tampered" in path.read_bytes():
            with open(work / "MARKER", "a") as f:
                f.write("cubin\n")


@pytest.fixture
def trusted(tmp_path):
    private, _ = signing.generate(tmp_path / "trusted", "release")
    return signing.SigningKey.load(private)


@pytest.mark.parametrize("configured", [True, False], ids=["trusted-keys", "no-keys"])
def test_a_bundle_install_runs_no_tampered_code(tmp_path, payload, marker, trusted, configured):
    """With trusted keys, and by default without any: refused, nothing runs."""
    trust = signing.Trust.load(tmp_path / "trusted") if configured else signing.Trust()
    volume = tmp_path / "volume"
    family, triton = volume / "inductor", volume / "triton-cache"
    for case, path in hostile_bundles(tmp_path, payload, trusted).items():
        refusal = refused(
            path,
            volume / "registry",
            expect=None,
            roots={"triton-kernels": triton, "inductor": family},
            trust=trust,
        )
        assert str(path) in refusal, case
        if not configured:
            assert "no trusted keys are configured" in refusal, case
        run_everything(family, triton, tmp_path)
        assert not marker.exists(), case
    # the same payload with the explicit opt-out: installed, and it runs
    bundle.install(
        hostile_bundles(tmp_path / "control", payload, trusted)["tampered"],
        Store(volume / "registry", create=True),
        expect=None,
        roots={"triton-kernels": triton, "inductor": family},
        trust=UNSIGNED_OK,
    )
    run_everything(family, triton, tmp_path)
    assert sorted(set(marker.read_text().split())) == ["cubin", "module", "so"]


@pytest.mark.parametrize("configured", [True, False], ids=["trusted-keys", "no-keys"])
def test_the_watcher_runs_no_tampered_code(tmp_path, payload, marker, trusted, configured):
    from tests.warmup.sidecar.test_server import ready_status, reloads, running
    from warmup.core.settings import Settings

    settings = Settings(
        volume=tmp_path / "volume",
        work_dir=tmp_path / "work",
        manifest=Path(__file__).parent / "kernels_demo.yaml",
        reload_debounce_s=0.1,
        trusted_keys=tmp_path / "trusted" if configured else None,
        allow_unsigned=False,
    )
    ready_status(settings)
    with running(settings) as car:
        for name, path in hostile_bundles(tmp_path, payload, trusted).items():
            shutil.copy(path, settings.paths.bundle_dir / f"{name}.tgz")
        assert wait_for(lambda: reloads(car).get("rejected") == 3)
    paths = settings.paths.layout
    run_everything(paths.inductor, paths.triton_cache, tmp_path)
    assert not marker.exists()


def test_a_redis_writer_without_the_key_runs_no_code_in_a_pod(
    tmp_path,
    payload,
    marker,
    redis,  # noqa: F811
):
    """The attacker writes the payload to the Redis tier, unsigned and signed by a key
    nobody trusts, every family's way; a pod that trusts the fleet's key fetches it."""
    from registry.remote import models as remote_models
    from registry.remote import triton as remote_triton

    redis.client.flushall()
    private, _ = signing.generate(tmp_path / "stranger", "stranger")
    signing.generate(tmp_path / "fleet", "fleet")
    family, triton = _sources(tmp_path / "attacker", payload)
    where = {"model": MODEL, "key_digest": KEY, "fingerprint": FP}
    files = {p.name: p.read_bytes() for p in (triton / HASH).iterdir()}
    fleet = signing.Trust.load(tmp_path / "fleet")
    attackers = (UNSIGNED_OK, signing.Trust.load(None, signing_key=private))  # any writer
    for attacker, trust in itertools.product(attackers, (fleet, signing.Trust())):
        writer = RemoteTier(redis.url, timeout_s=0.5, trust=attacker)
        assert remote_models.publish(writer, family, **where)
        for name, data in files.items():
            remote_triton.publish(writer, HASH, name, data)  # the .so is refused: never shared
        pod = tmp_path / f"pod-{len(list(tmp_path.glob('pod-*')))}"
        reader = RemoteTier(redis.url, timeout_s=0.5, trust=trust)  # the fleet's, or none
        assert not remote_models.fetch(reader, pod / "inductor", **where)
        fetched = remote_triton.fetch(reader, HASH, list(files))
        assert fetched == {} and reader.stats.refused >= 2
        for name, data in fetched.items():
            (pod / "triton-cache" / HASH).mkdir(parents=True, exist_ok=True)
            (pod / "triton-cache" / HASH / name).write_bytes(data)
        run_everything(pod / "inductor", pod / "triton-cache", tmp_path)
        assert not marker.exists()
    # a pod that opted out takes the same values, and runs them
    pod, reader = tmp_path / "trusting", RemoteTier(redis.url, timeout_s=0.5, trust=UNSIGNED_OK)
    assert remote_models.fetch(reader, pod / "inductor", **where)
    fetched = remote_triton.fetch(reader, HASH, list(files))
    assert set(fetched) == {"kernel.cubin"}  # host code never travels by redis
    (pod / "triton-cache" / HASH).mkdir(parents=True)
    (pod / "triton-cache" / HASH / "kernel.cubin").write_bytes(fetched["kernel.cubin"])
    run_everything(pod / "inductor", pod / "triton-cache", tmp_path)
    assert sorted(set(marker.read_text().split())) == ["cubin", "module", "so"]
