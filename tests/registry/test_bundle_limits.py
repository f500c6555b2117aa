"""Bundles read in bounded memory, installed all or nothing, whatever the archive holds."""

import gzip
import hashlib
import io
import json
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from registry import BundleRejected, RegistryError, Store
from registry.bundles import bundle
from registry.storage.store import CURRENT
from tests.conftest import gpu_fingerprint
from tests.registry._bundles import UNSIGNED_OK, refused
from tests.tar_blocks import header, negative_size, pax
from warmup.cli import main

MIB = 2**20


@pytest.fixture
def source(tmp_path, make_entry):
    store = Store(tmp_path / "source", create=True)
    store.put_many([make_entry(m=m) for m in (1024, 2048)])
    return store


@pytest.fixture
def with_cache(tmp_path, source):
    """A bundle of two entries and two artifacts (a cubin and its group file)."""
    cache = tmp_path / "cache-a" / "HASH1"
    cache.mkdir(parents=True)
    (cache / "k.cubin").write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    (cache / "__grp__k.json").write_text(
        json.dumps({"child_paths": {"k.cubin": str(cache / "k.cubin")}})
    )
    out = tmp_path / "with-cache.tgz"
    bundle.create(
        out, name="b", version="1", entries=source.entries(), roots={"triton-kernels": cache.parent}
    )
    return out


def _peak(call):
    """Run ``call``; return (its result or exception, peak bytes Python allocated meanwhile)."""
    tracemalloc.start()
    try:
        result = call()
    except Exception as e:
        result = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, peak


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file and folder under ``folder``, with the bytes of each file."""
    if not folder.exists():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


def _padded(size: int):
    """``size`` zero bytes padded to whole tar blocks, in 1 MiB pieces."""
    left = -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    while left:
        yield bytes(min(MIB, left))
        left -= min(MIB, left)


def _sparse_extensions(blocks: int):
    """An old-style GNU sparse header whose extension blocks go on for ``blocks`` blocks,
    each with 21 (offset, size) pairs that tarfile keeps in a list."""
    head = bytearray(header("sparse", 0, tarfile.GNUTYPE_SPARSE))
    head[482] = 1  # isextended
    head[148:156] = b" " * 8
    head[148:155] = b"%06o\0" % sum(head)
    yield bytes(head)
    block = bytearray(b"00000000001\0" * 42 + bytes(8))
    block[504] = 1
    for _ in range(blocks):
        yield bytes(block)


def _gzip(path: Path, pieces) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as f:
        for piece in pieces:
            f.write(piece)
        f.write(bytes(2 * tarfile.BLOCKSIZE))
    return path


def _bomb(path: Path, kind: str) -> Path:
    """A small file that asks tarfile for 64 MiB of header bytes."""
    size = 64 * MIB
    if kind == "gnu-long-name":
        pieces = [header("././@LongLink", size, tarfile.GNUTYPE_LONGNAME), *_padded(size)]
    elif kind == "pax":
        pieces = [header("pax", size, tarfile.XHDTYPE), *_padded(size)]
    else:
        pieces = list(_sparse_extensions(size // tarfile.BLOCKSIZE // 8))
    return _gzip(path, pieces)


@pytest.mark.parametrize("kind", ["gnu-long-name", "pax", "sparse-extensions"])
def test_a_huge_tar_header_is_refused_before_it_is_read(tmp_path, kind):
    bomb = _bomb(tmp_path / "bomb.tgz", kind)
    assert bomb.stat().st_size < MIB
    result, peak = _peak(lambda: bundle.verify(bomb, trust=UNSIGNED_OK))
    assert isinstance(result, BundleRejected), result
    assert "tar headers" in result.reason and "limit 8192" in result.reason
    assert peak < 8 * MIB


def test_member_data_is_hashed_and_staged_in_chunks_never_held(tmp_path, source, h200):
    cache = tmp_path / "cache-a" / "HASH1"
    cache.mkdir(parents=True)
    with open(cache / "big.cubin", "wb") as f:
        f.truncate(48 * MIB)  # zeros: a small archive, a big member
    (cache / "noise.cubin").write_bytes(os.urandom(16 * MIB))  # a big archive
    out = tmp_path / "big.tgz"
    bundle.create(
        out, name="b", version="1", entries=source.entries(), roots={"triton-kernels": cache.parent}
    )
    target = tmp_path / "vol" / "triton-cache"

    def verify_and_install():
        bundle.verify(out, trust=UNSIGNED_OK)
        return bundle.install(
            out,
            Store(tmp_path / "t", create=True),
            expect=h200,
            roots={"triton-kernels": target},
            trust=UNSIGNED_OK,
        )

    info, peak = _peak(verify_and_install)
    assert not isinstance(info, Exception), info
    assert info["artifacts"] == 2 and peak < 12 * MIB
    assert (target / "HASH1" / "big.cubin").stat().st_size == 48 * MIB
    assert (target / "HASH1" / "noise.cubin").read_bytes() == (cache / "noise.cubin").read_bytes()
    assert [p.name for p in target.iterdir()] == ["HASH1"]  # the staging folder is gone


def _tar(path: Path, members, *, listed=None, edit=None, raw_manifest=None) -> Path:
    """A bundle of ``members`` (data None: a folder) whose MANIFEST.json (first) lists
    ``listed`` (default: every file), changed by ``edit``, or is ``raw_manifest``."""
    manifest = {
        "format": bundle.FORMAT,
        "schema": bundle.SCHEMA,
        "name": "n",
        "version": "1",
        "created": "now",
        "fingerprints": [],
        "members": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in (members if listed is None else listed)
            if data is not None
        },
    }
    if edit:
        edit(manifest)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        head = raw_manifest or json.dumps(manifest).encode()
        for name, data in [("MANIFEST.json", head), *members]:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))
    return path


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _artifacts(count: int, size: int = 1) -> list[tuple[str, bytes]]:
    return [(f"triton-cache/h{i}/k.bin", bytes(size)) for i in range(count)]


@pytest.mark.parametrize(
    "members,limits,expected",
    [
        (_artifacts(20), {"max_members": 10}, "lists 20 members; limit 10"),
        ([("triton-cache/h/" + "x" * 1100, b"")], {}, "limit 1024"),
        (_artifacts(1, 3000), {"max_member_bytes": 2048}, "limit 2048"),
        (_artifacts(3, 1000), {"max_total_bytes": 2500}, "total limit 2500"),
        ([("entries/e.json", b" " * 5000)], {"max_entry_bytes": 4096}, "limit 4096"),
        (
            [(f"entries/{i}.json", b" " * 900) for i in range(4)],
            {"max_entries_bytes": 3000},
            "entries add up to 3600 bytes; limit 3000",
        ),
        (
            [("entries/e.json", b"[" + b"0," * 3000 + b"0]")],
            {"max_entry_values": 2000},
            "'entries/e.json' has 3002 JSON values; limit 2000",
        ),
        (
            _artifacts(100),
            {"max_manifest_values": 500},
            "MANIFEST.json has 6.. JSON values; limit 500",
        ),
        (_artifacts(1), {"max_manifest_bytes": 100}, "MANIFEST.json is"),
        (
            [("notes.txt", b"hi")],
            {},
            "not under entries/, triton-cache/, inductor/, packages/, caches/",
        ),
        ([("triton-cache/k.bin", b"x")], {}, "not triton-cache/<hash>/<file>"),
        ([("entries/./e.json", b"{}")], {}, "not a normalised relative path"),
        ([("triton-cache/h/a\nb", b"")], {}, "has a control character"),
        ([("triton-cache/h/" + "x" * 300, b"")], {}, "a path component of 300 bytes; limit 255"),
        ([("entries/" + "e" * 256, b"{}")], {}, "a path component of 256 bytes; limit 255"),
        ([("triton-cache/.bundle-x/k.bin", b"")], {}, "'.bundle-x' is not a Triton cache folder"),
        ([("triton-cache/a b/k.bin", b"")], {}, "'a b' is not a Triton cache folder"),
        ([("triton-cache/" + "h" * 129 + "/k", b"")], {}, "is not a Triton cache folder"),
        (
            [("triton-cache/h/.k.bin", b"")],
            {},
            "'triton-cache/h/.k.bin' has a file name that starts",
        ),
    ],
)
def test_limits_are_checked_from_the_manifest_before_members_are_read(
    tmp_path, members, limits, expected
):
    path = _tar(tmp_path / "b.tgz", members)
    with pytest.raises(BundleRejected, match=expected.replace("<", ".").replace(">", ".")):
        bundle.verify(path, **limits, trust=UNSIGNED_OK)


def test_the_json_values_of_all_entries_are_bounded(tmp_path, with_cache):
    with tarfile.open(with_cache) as tar:
        entries = [tar.extractfile(m).read() for m in tar if m.name.startswith("entries/")]
    total = sum(1 + sum(e.count(c) for c in (b"{", b"[", b",", b":")) for e in entries)
    bundle.verify(with_cache, max_entries_values=total, trust=UNSIGNED_OK)
    with pytest.raises(BundleRejected, match=f"have {total} JSON values; limit {total - 1}"):
        bundle.verify(with_cache, max_entries_values=total - 1, trust=UNSIGNED_OK)


def test_a_member_count_over_the_limit_is_refused_while_streaming(tmp_path):
    path = _tar(
        tmp_path / "b.tgz", _artifacts(5) + [(f"triton-cache/d{i}", None) for i in range(30)]
    )
    with pytest.raises(
        BundleRejected, match=r"member 11 \('triton-cache/d4'\) is one too many; limit 10 members"
    ):
        bundle.verify(path, max_members=10, trust=UNSIGNED_OK)


def test_a_member_must_have_the_size_the_manifest_lists(tmp_path):
    members = _artifacts(1, 100)

    def lie(manifest):
        manifest["members"]["triton-cache/h0/k.bin"]["size"] = 10

    with pytest.raises(BundleRejected, match=r"is 100 bytes; MANIFEST.json lists 10"):
        bundle.verify(_tar(tmp_path / "b.tgz", members, edit=lie), trust=UNSIGNED_OK)


def test_the_manifest_must_come_first(tmp_path, with_cache):
    with tarfile.open(with_cache) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members[1:] + members[:1]:
            tar.addfile(info, io.BytesIO(data))
    last = tmp_path / "last.tgz"
    last.write_bytes(gzip.compress(buffer.getvalue()))
    with pytest.raises(BundleRejected, match=r"no MANIFEST\.json as the first member"):
        bundle.verify(last, trust=UNSIGNED_OK)


def _corruptions(good: bytes):
    size = len(good)
    for at in (size // 10, size // 3, size // 2, 2 * size // 3, size - 20, size - 6):
        yield f"flip@{at}", good[:at] + bytes([good[at] ^ 0x10]) + good[at + 1 :]
    for at in (size // 4, size // 2, size - 9, size - 1):
        yield f"cut@{at}", good[:at]
    yield "trailing garbage", good + b"garbage!"


def test_a_corrupt_or_truncated_gzip_is_rejected_never_a_traceback(tmp_path, source, h200):
    cache = tmp_path / "cache-a" / "HASH1"
    cache.mkdir(parents=True)
    (cache / "k.cubin").write_bytes(b"".join(b"%d," % i for i in range(60_000)))
    good = tmp_path / "good.tgz"
    bundle.create(
        good,
        name="b",
        version="1",
        entries=source.entries(),
        roots={"triton-kernels": cache.parent},
    )
    escaped = {}
    for label, data in _corruptions(good.read_bytes()):
        bad = tmp_path / "bad.tgz"
        bad.write_bytes(data)
        try:
            bundle.install(
                bad,
                Store(tmp_path / "t", create=True),
                expect=h200,
                roots={"triton-kernels": tmp_path / "c"},
                trust=UNSIGNED_OK,
            )
        except BundleRejected:
            pass
        except Exception as e:
            escaped[label] = repr(e)
        assert not (tmp_path / "c").exists() and not (tmp_path / "t" / CURRENT).exists(), label
    assert escaped == {}


def test_the_cli_reports_a_malformed_bundle_as_rejected(capsys, isolated, tmp_path):
    deep = b'{"format": "triton-warmup-bundle", "x": ' + _deep(100_000) + b"}"
    path = _tar(tmp_path / "b.tgz", _artifacts(1), raw_manifest=deep)
    code = main(["registry", "bundle", "verify", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "rejected: MANIFEST.json is not JSON" in err, err


def _with_entry(path: Path, built: Path, change) -> Path:
    """``built`` with its first entry's JSON changed by ``change`` and listed anew."""
    with tarfile.open(built) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    manifest = json.loads(members[0][1])
    rest = members[1:]
    name, data = next((n, d) for n, d in rest if n.startswith("entries/"))
    new = change(json.loads(data))
    new = new if isinstance(new, bytes) else json.dumps(new).encode()
    rest = [(n, new if n == name else d) for n, d in rest]
    return _tar(path, rest, edit=lambda m: m.update(fingerprints=manifest["fingerprints"]))


def _set(path: str, value):
    def change(data):
        target = data
        *parents, last = path.split(".")
        for key in parents:
            target = target[key]
        target[last] = value
        return data

    return change


@pytest.mark.parametrize(
    "change",
    [
        lambda d: b'{"schema": 1, "key": ' + _deep(100_000) + b"}",
        lambda d: _deep(100_000),
        _set("measurements", 5),
        _set("measurements", [5]),
        _set("best", "x"),
        _set("key", [1]),
        _set("fingerprint", [1]),
        _set("fingerprint.hardware", {"gpu_name": 1}),
        _set("fingerprint.hardware.compute_capability", 90),
        _set("fingerprint.software.torch", {"a": 1}),
        _set("created", {"a": 1}),
        _set("tuning_seconds", "x"),
    ],
)
def test_a_malformed_entry_is_rejected_never_a_traceback(tmp_path, with_cache, h200, change):
    bad = _with_entry(tmp_path / "bad.tgz", with_cache, change)
    cache = tmp_path / "vol" / "triton-cache"
    for force in (False, True):
        refused(bad, tmp_path / "t", expect=h200, force=force, roots={"triton-kernels": cache})
        assert _tree(cache) == {} and _tree(tmp_path / "t") == {}


def test_a_deeply_nested_manifest_is_rejected(tmp_path):
    deep = b'{"format": "triton-warmup-bundle", "x": ' + _deep(100_000) + b"}"
    path = _tar(tmp_path / "b.tgz", _artifacts(1), raw_manifest=deep)
    with pytest.raises(BundleRejected, match=r"MANIFEST\.json is not JSON"):
        bundle.verify(path, trust=UNSIGNED_OK)


def test_forced_install_of_an_int_compute_capability_leaves_no_cubin(tmp_path, with_cache, h200):
    bad = _with_entry(
        tmp_path / "bad.tgz", with_cache, _set("fingerprint.hardware.compute_capability", 90)
    )
    cache = tmp_path / "vol" / "triton-cache"
    (cache / "OLD").mkdir(parents=True)
    (cache / "OLD" / "a.cubin").write_bytes(b"old")
    target = Store(tmp_path / "t", create=True)
    target.put(Store(tmp_path / "source").entries()[0])
    before = _tree(cache), _tree(tmp_path / "t")
    with pytest.raises(BundleRejected):
        bundle.install(
            bad, target, expect=h200, force=True, roots={"triton-kernels": cache}, trust=UNSIGNED_OK
        )
    assert (_tree(cache), _tree(tmp_path / "t")) == before


class FailingStore(Store):
    def install(self, entries, *, record, **steps):
        raise RegistryError("disk full")


def test_artifacts_reach_the_cache_only_after_the_store_installed(tmp_path, with_cache, h200):
    cache = tmp_path / "vol" / "triton-cache"
    with pytest.raises(RegistryError, match="disk full"):
        bundle.install(
            with_cache,
            FailingStore(tmp_path / "t", create=True),
            expect=h200,
            roots={"triton-kernels": cache},
            trust=UNSIGNED_OK,
        )
    assert _tree(cache) == {} and not cache.exists()
    bundle.install(
        with_cache,
        Store(tmp_path / "t", create=True),
        expect=h200,
        roots={"triton-kernels": cache},
        trust=UNSIGNED_OK,
    )
    assert sorted(_tree(cache)) == ["HASH1", "HASH1/__grp__k.json", "HASH1/k.cubin"]


def test_a_bad_artifact_after_staging_leaves_the_cache_as_it_was(tmp_path, with_cache, h200):
    with tarfile.open(with_cache) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()][1:]
    good = list(members)
    members[-1] = (members[-1][0], b"tampered" + members[-1][1][8:])  # the last member
    bad = _tar(tmp_path / "bad.tgz", members, listed=good)
    cache = tmp_path / "vol" / "triton-cache"
    (cache / "HASH1").mkdir(parents=True)
    (cache / "HASH1" / "k.cubin").write_bytes(b"mine")
    before = _tree(cache)
    with pytest.raises(BundleRejected, match="checksum mismatch"):
        bundle.install(
            bad,
            Store(tmp_path / "t", create=True),
            expect=h200,
            roots={"triton-kernels": cache},
            trust=UNSIGNED_OK,
        )
    assert _tree(cache) == before


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda fps: fps.append({"digest": "f" * 64, "gpu": "g", "software": "s"}), "f" * 64),
        (lambda fps: fps.clear(), "not listed in MANIFEST.json 'fingerprints'"),
        (lambda fps: fps[0].pop("gpu"), "'fingerprints' item 0"),
        (lambda fps: fps[0].update(digest=5), "'fingerprints' item 0"),
        (lambda fps: fps.append("x"), "'fingerprints' item 1"),
    ],
)
def test_the_manifest_fingerprint_list_must_match_the_entries(tmp_path, with_cache, edit, expected):
    with tarfile.open(with_cache) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    manifest = json.loads(members[0][1])
    edit(manifest["fingerprints"])
    bad = _tar(
        tmp_path / "bad.tgz",
        members[1:],
        edit=lambda m: m.update(fingerprints=manifest["fingerprints"]),
    )
    with pytest.raises(BundleRejected, match=expected):
        bundle.verify(bad, trust=UNSIGNED_OK)


def test_a_fingerprint_list_that_is_not_a_list_is_rejected(tmp_path, with_cache):
    with tarfile.open(with_cache) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()][1:]
    bad = _tar(tmp_path / "bad.tgz", members, edit=lambda m: m.update(fingerprints={}))
    with pytest.raises(BundleRejected, match="'fingerprints' is not a list"):
        bundle.verify(bad, trust=UNSIGNED_OK)


def test_an_artifact_bundle_round_trips_with_its_fingerprints(tmp_path, with_cache, h200):
    verified = bundle.verify(with_cache, trust=UNSIGNED_OK)
    assert [f["digest"] for f in verified.manifest["fingerprints"]] == [h200.digest()]
    assert sorted(verified.parts["triton-kernels"].files) == [
        "HASH1/__grp__k.json",
        "HASH1/k.cubin",
    ]
    assert verified.sha256 == hashlib.sha256(with_cache.read_bytes()).hexdigest()
    a100 = gpu_fingerprint("NVIDIA A100", cc="8.0", sms=108)
    cache = tmp_path / "vol" / "triton-cache"
    roots = {"triton-kernels": cache}
    refused(with_cache, tmp_path / "t", match="compute_capability", expect=a100, roots=roots)
    assert not cache.exists() and not os.path.exists(tmp_path / "t" / CURRENT)


def _negative_manifest(kind: str) -> bytes:
    """A MANIFEST.json header of size -1 (base-256 field, or a PAX record); 8 MiB of
    zeros follow it in the test, which ``read(-1)`` would decompress into memory."""
    if kind == "base-256":
        return negative_size("MANIFEST.json")
    return pax(b"size=-1") + header("MANIFEST.json")


@pytest.mark.parametrize("kind", ["base-256", "pax"])
def test_a_negative_member_size_is_rejected_before_its_data_is_read(tmp_path, kind):
    path = _gzip(tmp_path / "neg.tgz", [_negative_manifest(kind), *_padded(8 * MIB)])
    result, peak = _peak(lambda: bundle.verify(path, trust=UNSIGNED_OK))
    assert isinstance(result, BundleRejected), result
    assert result.reason == "member 'MANIFEST.json' has a negative size (-1)"
    assert peak < 2 * MIB


def test_a_file_larger_than_any_bundle_within_the_limits_is_refused_unread(tmp_path):
    path = tmp_path / "huge.tgz"
    with open(path, "wb") as f:
        f.truncate(64 * MIB)  # sparse: the check reads no byte of it
    limits = {"max_total_bytes": MIB, "max_members": 16, "max_header_bytes": 4096}
    with pytest.raises(BundleRejected, match=r"the file is 67108864 bytes; limit \d+ \(") as e:
        bundle.verify(path, **limits, trust=UNSIGNED_OK)
    assert int(e.value.reason.split("limit ")[1].split()[0]) < 4 * MIB
    del limits["max_total_bytes"]
    with pytest.raises(BundleRejected, match=r"not a readable tar\.gz archive"):
        bundle.verify(
            path, **limits, trust=UNSIGNED_OK
        )  # within the default limit: read, and not a gzip


def test_a_group_file_over_its_limit_is_rejected_from_the_manifest(tmp_path):
    name = "triton-cache/h/__grp__k.json"

    def big(manifest):
        manifest["members"][name]["size"] = 2 * MIB

    path = _tar(tmp_path / "b.tgz", [(name, b"{}")], edit=big)
    with pytest.raises(
        BundleRejected, match=f"group file '{name}' is {2 * MIB} bytes; limit {MIB}"
    ):
        bundle.verify(path, trust=UNSIGNED_OK)
    with pytest.raises(BundleRejected, match=r"group file .* is 2 bytes; limit 1$"):
        bundle.verify(
            _tar(tmp_path / "c.tgz", [(name, b"{}")]), max_group_bytes=1, trust=UNSIGNED_OK
        )


def test_install_relocates_only_the_group_files_it_brought(tmp_path, with_cache, h200):
    cache = tmp_path / "vol" / "triton-cache"
    other = cache / "OTHER" / "__grp__x.json"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"child_paths": {"x.cubin": "/elsewhere/x.cubin"}}))
    before = other.read_bytes()
    bundle.install(
        with_cache,
        Store(tmp_path / "t", create=True),
        expect=h200,
        roots={"triton-kernels": cache},
        trust=UNSIGNED_OK,
    )
    group = json.loads((cache / "HASH1" / "__grp__k.json").read_text())
    assert group == {"child_paths": {"k.cubin": str(cache / "HASH1" / "k.cubin")}}
    assert other.read_bytes() == before


def test_artifacts_reach_the_cache_right_after_the_swap_before_garbage_collection(
    tmp_path, with_cache, h200
):
    cache = tmp_path / "vol" / "triton-cache"
    seen = []

    class Watching(Store):
        def _collect_garbage(self):
            files = sorted(p for p in _tree(cache) if not p.startswith(".bundle-"))
            seen.append(((self.root / CURRENT).exists(), files))
            return super()._collect_garbage()

    bundle.install(
        with_cache,
        Watching(tmp_path / "t", create=True),
        expect=h200,
        roots={"triton-kernels": cache},
        trust=UNSIGNED_OK,
    )
    assert seen[-1] == (True, ["HASH1", "HASH1/__grp__k.json", "HASH1/k.cubin"])


def test_a_failure_while_staging_is_a_rejection(tmp_path, with_cache, h200):
    cache = tmp_path.joinpath(*["d" * 250] * 20)  # longer than PATH_MAX: each stat fails
    roots = {"triton-kernels": cache}
    refused(with_cache, tmp_path / "t", match="cannot stage artifact", expect=h200, roots=roots)
    assert not (tmp_path / "t" / CURRENT).exists()


def test_a_failure_moving_artifacts_after_the_swap_is_logged_not_raised(
    tmp_path, with_cache, h200, caplog
):
    cache = tmp_path / "vol" / "triton-cache"

    class Obstructed(Store):
        def install(self, entries, *, record, **hooks):
            (cache / "HASH1").write_bytes(b"in the way")  # the artifacts are staged by now
            return super().install(entries, record=record, **hooks)

    info = bundle.install(
        with_cache,
        Obstructed(tmp_path / "t", create=True),
        expect=h200,
        roots={"triton-kernels": cache},
        trust=UNSIGNED_OK,
    )
    assert info["artifacts"] == 2 and len(Store(tmp_path / "t")) == 2
    assert "2 of 2 artifacts not moved into the cache" in caplog.text and "HASH1/" in caplog.text
    assert [p.name for p in cache.iterdir()] == ["HASH1"]  # the staging folder is gone
