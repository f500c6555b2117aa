import gzip
import hashlib
import io
import json
import os
import signal
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from registry import BundleRejected, KernelConfig, MatchPolicy, Measurement, Store
from registry.bundles import bundle
from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from registry.storage.store import CURRENT
from tests.conftest import gpu_fingerprint
from tests.registry._bundles import UNSIGNED_OK
from tests.registry._workers import started

KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}


@pytest.fixture
def source(tmp_path, make_entry):
    store = Store(tmp_path / "source", create=True)
    store.put_many([make_entry(m=m) for m in (1024, 2048, 4096)])
    return store


@pytest.fixture
def built(tmp_path, source):
    out = tmp_path / "b.tgz"
    bundle.create(out, name="llama-tp2", version="7", entries=source.entries())
    return out


def test_create_verify_install_round_trip(tmp_path, built, source, h200):
    verified = bundle.verify(built, trust=UNSIGNED_OK)
    assert (verified.name, verified.version, len(verified.entries)) == ("llama-tp2", "7", 3)
    manifest = verified.manifest
    assert manifest["fingerprints"] == [
        {"digest": h200.digest(), "gpu": h200.gpu_slug(), "software": h200.software_slug()}
    ]
    assert all(len(m["sha256"]) == 64 for m in manifest["members"].values())
    target = Store(tmp_path / "target", create=True)
    info = bundle.install(built, target, expect=h200, trust=UNSIGNED_OK)
    assert info["entries"] == 3 and info["bundle"]["name"] == "llama-tp2"
    assert target.lookup("ag_gemm", KEY, h200) == source.lookup("ag_gemm", KEY, h200)
    assert [g.bundle["name"] for g in bundle.installed(target)] == ["llama-tp2"]


def test_the_winning_algorithm_round_trips_through_a_bundle(tmp_path, make_entry, h200):
    """Schema-2 entries (a config naming its algorithm) beside a schema-1 one."""
    baseline = KernelConfig.make(algorithm="nccl_cublas")
    overlap = KernelConfig.make(algorithm="overlap_cublas")
    chosen = [
        replace(make_entry(m=256), best=baseline, measurements=(Measurement(baseline, 0.08),)),
        replace(make_entry(m=8192), best=overlap, measurements=(Measurement(overlap, 1.4),)),
        make_entry(m=4096),  # written before algorithms: no algorithm, schema 1
    ]
    source = Store(tmp_path / "source", create=True)
    source.put_many(chosen)
    out = tmp_path / "algorithms.tgz"
    bundle.create(out, name="tp2", version="1", entries=source.entries())
    schemas = {json.loads(data)["schema"] for name, data in _members(out).items() if "/" in name}
    assert schemas == {1, 2}
    target = Store(tmp_path / "target", create=True)
    bundle.install(out, target, expect=h200, trust=UNSIGNED_OK)
    for m, algorithm in ((256, "nccl_cublas"), (8192, "overlap_cublas"), (4096, None)):
        found = target.lookup("ag_gemm", {**KEY, "M": m}, h200)
        assert found is not None and found.best.algorithm == algorithm
        assert found == source.lookup("ag_gemm", {**KEY, "M": m}, h200)


def test_install_then_rollback_restores_the_previous_generation(tmp_path, built, h200, make_entry):
    target = Store(tmp_path / "target", create=True)
    mine = target.put(make_entry(m=1, block_m=16))
    bundle.install(built, target, expect=h200, trust=UNSIGNED_OK)
    assert len(target) == 4
    target.rollback()
    assert [e.key["M"] for e in target.entries()] == [1] and target.entries()[0] == mine


def test_fingerprint_mismatch_rejects_unless_forced(tmp_path, built):
    target = Store(tmp_path / "target", create=True)
    a100 = gpu_fingerprint("NVIDIA A100", cc="8.0", sms=108)
    with pytest.raises(BundleRejected, match="compute_capability"):
        bundle.install(built, target, expect=a100, trust=UNSIGNED_OK)
    assert len(target) == 0 and not (tmp_path / "target" / CURRENT).exists()
    h100 = gpu_fingerprint("NVIDIA H100", sms=114)
    with pytest.raises(BundleRejected, match="gpu_name"):
        bundle.install(built, target, expect=h100, trust=UNSIGNED_OK)
    bundle.install(built, target, expect=h100, policy=MatchPolicy.SAME_ARCH, trust=UNSIGNED_OK)
    assert len(target) == 3
    bundle.install(
        built, Store(tmp_path / "forced", create=True), expect=a100, force=True, trust=UNSIGNED_OK
    )
    assert len(Store(tmp_path / "forced")) == 3


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _write(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(gzip.compress(buffer.getvalue()))
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _rebuild(built: Path, out: Path, *, manifest_edit=None, extra=(), drop=(), replace=None):
    """Rewrite a good bundle with a fault; the manifest lists what it says unless edited."""
    members = _members(built)
    manifest = json.loads(members.pop("MANIFEST.json"))
    for name in drop:
        members.pop(name)
    for name, data in (replace or {}).items():
        members[name] = data
    if manifest_edit:
        manifest_edit(manifest)
    entries = [_file("MANIFEST.json", json.dumps(manifest).encode())]
    entries += [_file(n, d) for n, d in members.items()]
    return _write(out, entries + list(extra))


def _listed(manifest, name, data):
    manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _special(name, kind, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def _one_entry(built):
    return next(n for n in _members(built) if n.startswith("entries/"))


@pytest.mark.parametrize(
    "fault,expected",
    [
        ("checksum", "checksum mismatch"),
        ("schema", "unknown schema version"),
        ("absolute", "absolute path"),
        ("dotdot", "'..' component"),
        ("symlink", "is a link"),
        ("hardlink", "is a link"),
        ("device", "device, fifo"),
        ("fifo", "device, fifo"),
        ("unlisted", "not listed"),
        ("missing", "listed but missing"),
        ("entry_schema", "schema"),
        ("no_manifest", "no MANIFEST.json"),
        ("duplicate", "appears twice"),
    ],
)
def test_install_refuses_bad_archives_and_installs_nothing(tmp_path, built, h200, fault, expected):
    name = _one_entry(built)
    evil = b'{"x": 1}'
    faults = {
        "checksum": dict(replace={name: _members(built)[name].replace(b"128", b"256")}),
        "schema": dict(manifest_edit=lambda m: m.update(schema=2)),
        "absolute": dict(
            extra=[_file("/etc/cron.d/x", evil)],
            manifest_edit=lambda m: _listed(m, "/etc/cron.d/x", evil),
        ),
        "dotdot": dict(
            extra=[_file("entries/../../x.json", evil)],
            manifest_edit=lambda m: _listed(m, "entries/../../x.json", evil),
        ),
        "symlink": dict(extra=[_special("entries/s.json", tarfile.SYMTYPE, "/etc/passwd")]),
        "hardlink": dict(extra=[_special("entries/h.json", tarfile.LNKTYPE, "/etc/passwd")]),
        "device": dict(extra=[_special("entries/dev", tarfile.CHRTYPE)]),
        "fifo": dict(extra=[_special("entries/fifo", tarfile.FIFOTYPE)]),
        "unlisted": dict(extra=[_file("entries/extra.json", evil)]),
        "missing": dict(drop=[name]),
        "entry_schema": dict(replace={name: evil}, manifest_edit=lambda m: _listed(m, name, evil)),
        "duplicate": dict(extra=[_file(name, _members(built)[name])]),
    }
    bad = tmp_path / "bad.tgz"
    if fault == "no_manifest":
        _write(bad, [_file(n, d) for n, d in _members(built).items() if n != "MANIFEST.json"])
    else:
        _rebuild(built, bad, **faults[fault])
    target = Store(tmp_path / "target", create=True)
    target.put(Store(tmp_path / "source").entries()[0])
    before = os.readlink(tmp_path / "target" / CURRENT)
    with pytest.raises(BundleRejected, match=expected):
        bundle.install(
            bad,
            target,
            expect=h200,
            roots={"triton-kernels": tmp_path / "cache"},
            trust=UNSIGNED_OK,
        )
    assert os.readlink(tmp_path / "target" / CURRENT) == before and len(target) == 1
    assert not (tmp_path / "cache").exists()


def test_oversized_member_is_refused(tmp_path, built):
    with pytest.raises(BundleRejected, match="limit"):
        bundle.verify(built, max_member_bytes=100, trust=UNSIGNED_OK)
    with pytest.raises(BundleRejected, match="total limit"):
        bundle.verify(built, max_total_bytes=1000, trust=UNSIGNED_OK)


@pytest.mark.parametrize(
    "content",
    [b"", b"not a tar at all", gzip.compress(b"x" * 100, mtime=0)],  # the same id on any worker
    ids=["empty", "text", "gzip-not-tar"],
)
def test_garbage_is_refused(tmp_path, content):
    bad = tmp_path / "x.tgz"
    bad.write_bytes(content)
    with pytest.raises(BundleRejected):
        bundle.verify(bad, trust=UNSIGNED_OK)


def test_bundle_carries_triton_artifacts_and_relocates_them(tmp_path, source, h200):
    cache = tmp_path / "cache-a" / "HASH1"
    cache.mkdir(parents=True)
    (cache / "k.cubin").write_bytes(b"\x7fELF")
    (cache / "__grp__k.json").write_text(
        json.dumps({"child_paths": {"k.cubin": str(cache / "k.cubin")}})
    )
    out = tmp_path / "with-cache.tgz"
    bundle.create(
        out, name="b", version="1", entries=source.entries(), roots={"triton-kernels": cache.parent}
    )
    assert len(bundle.verify(out, trust=UNSIGNED_OK).parts["triton-kernels"].files) == 2
    target_cache = tmp_path / "vol" / "triton-cache"
    info = bundle.install(
        out,
        Store(tmp_path / "t", create=True),
        expect=h200,
        roots={"triton-kernels": target_cache},
        trust=UNSIGNED_OK,
    )
    assert info["artifacts"] == 2
    group = json.loads((target_cache / "HASH1" / "__grp__k.json").read_text())
    assert group["child_paths"]["k.cubin"] == str(target_cache / "HASH1" / "k.cubin")
    with pytest.raises(BundleRejected, match="no cache folder"):
        bundle.install(out, Store(tmp_path / "t2", create=True), expect=h200, trust=UNSIGNED_OK)


def test_create_refuses_an_empty_or_nameless_bundle(tmp_path):
    with pytest.raises(Exception, match="empty"):
        bundle.create(tmp_path / "x.tgz", name="n", version="1", entries=[])
    with pytest.raises(Exception, match="name and a version"):
        bundle.create(tmp_path / "x.tgz", name="", version="1", entries=[])


def _models_bundle(tmp_path: Path) -> Path:
    """A bundle carrying one compiled model's files (the Inductor family)."""
    family, cache = tmp_path / "src" / "inductor", tmp_path / "src-cache"
    for rel in ("fxgraph/ab/fabc/entry", "ab/cabc.so"):
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(os.urandom(64))
    fp = cpu_fingerprint()
    inductor_cache.save(cache, family, model="mlp", key_digest="0" * 16, key={}, fingerprint=fp)
    out = tmp_path / "models.tgz"
    bundle.create(out, name="models", version="1", entries=[], roots={"inductor": family})
    return out


def _hanging_install(path: Path, store: Path, folder: Path, tmp_path: Path):
    """An install in another process, stopped for good once it staged its first file."""
    args = [str(path), str(store), "inductor", str(folder)]
    return started("hang_staging", *args, ready=tmp_path / "ready")


def test_the_next_install_removes_a_killed_installs_stage_never_a_live_one(tmp_path):
    path, store, folder = _models_bundle(tmp_path), tmp_path / "registry", tmp_path / "inductor"
    proc, stage = _hanging_install(path, store, folder, tmp_path)
    try:  # an install beside a live one: its stage stays, and both may go on
        assert bundle.install(
            path,
            Store(store, create=True),
            expect=None,
            roots={"inductor": folder},
            trust=UNSIGNED_OK,
        )
        assert stage.is_dir() and list(folder.glob(".bundle-*")) == [stage]
    finally:
        proc.send_signal(signal.SIGKILL)  # as a pod is killed
        proc.wait()
    assert stage.is_dir()  # what the killed install left
    info = bundle.install(
        path, Store(store), expect=None, roots={"inductor": folder}, trust=UNSIGNED_OK
    )
    assert info["unchanged"] and not list(folder.glob(".bundle-*"))
