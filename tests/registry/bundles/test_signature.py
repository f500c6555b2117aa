import gzip
import hashlib
import io
import json
import tarfile

import pytest

from registry import BundleRejected, Store
from registry.bundles import bundle
from registry.bundles import signature as bundle_signature
from registry.trust import signing
from registry.trust.signing import SigningKey, Trust


@pytest.fixture
def fleet(tmp_path):
    private, _ = signing.generate(tmp_path / "trusted", "fleet")
    return SigningKey.load(private), Trust.load(tmp_path / "trusted")


@pytest.fixture
def stranger(tmp_path):
    private, _ = signing.generate(tmp_path / "elsewhere", "stranger")
    return SigningKey.load(private)


@pytest.fixture
def entries(tmp_path, make_entry):
    source = Store(tmp_path / "source", create=True)
    source.put_many([make_entry(m=m) for m in (1024, 2048)])
    return source.entries()


def _unsigned(tmp_path, entries, name="u.tgz"):
    out = tmp_path / name
    bundle.create(out, name="tp2", version="1", entries=entries)
    return out


def _members(path):
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]


def _rewrite(path, members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))
    return path


def _tampered(signed, out):
    """``signed`` with one entry changed and MANIFEST.json rewritten to match: the parts
    agree, the signature is the original's."""
    members = dict(_members(signed))
    manifest = json.loads(members["MANIFEST.json"])
    name = next(n for n in members if n.startswith("entries/"))
    changed = members[name].replace(b'"BLOCK_M": 128', b'"BLOCK_M": 64')
    assert changed != members[name]
    members[name] = changed
    manifest["members"][name] = {
        "sha256": hashlib.sha256(changed).hexdigest(),
        "size": len(changed),
    }
    members["MANIFEST.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    order = ["SIGNATURE.json", "MANIFEST.json", *(n for n in members if "/" in n)]
    return _rewrite(out, [(n, members[n]) for n in order])


def test_a_bundle_signed_at_creation_verifies_against_its_key(tmp_path, entries, fleet):
    key, trust = fleet
    out = tmp_path / "s.tgz"
    bundle.create(out, name="tp2", version="1", entries=entries, signer=key)
    assert [n for n, _ in _members(out)][:2] == ["SIGNATURE.json", "MANIFEST.json"]
    verified = bundle.verify(out, trust=trust)
    assert verified.signed_by == key.key_id and len(verified.entries) == 2


def test_signing_an_existing_bundle_copies_it_behind_the_signature(tmp_path, entries, fleet):
    key, trust = fleet
    unsigned = _unsigned(tmp_path, entries)
    original = unsigned.read_bytes()
    signed = bundle.sign(unsigned, key, out=tmp_path / "s.tgz")
    assert unsigned.read_bytes() == original  # --out leaves the source alone
    assert (tmp_path / "s.tgz").read_bytes().endswith(original)  # no recompression
    assert signed.signed_by == key.key_id
    assert bundle.verify(tmp_path / "s.tgz", trust=trust).manifest_sha256 == (
        bundle.verify(unsigned).manifest_sha256
    )
    bundle.sign(unsigned, key)  # in place
    assert bundle.verify(unsigned, trust=trust).signed_by == key.key_id
    with pytest.raises(signing.RegistryError, match=f"signed already \\(key {key.key_id}\\)"):
        bundle.sign(unsigned, key)


@pytest.mark.parametrize("case", ["unsigned", "foreign", "tampered", "bad signature member"])
def test_with_trust_install_refuses_and_installs_nothing(tmp_path, entries, fleet, stranger, case):
    key, trust = fleet
    path = _unsigned(tmp_path, entries)
    expected = "unsigned"
    if case == "foreign":
        bundle.sign(path, stranger)
        expected = f"unknown key {stranger.key_id}"
    elif case == "tampered":
        bundle.sign(path, key)
        path = _tampered(path, tmp_path / "t.tgz")
        expected = f"key {key.key_id} does not verify"
    elif case == "bad signature member":
        bundle.sign(path, key)
        members = _members(path)
        members[0] = ("SIGNATURE.json", b'{"format": "triton-warmup-signature"}')
        path = _rewrite(tmp_path / "b.tgz", members)
        expected = "algorithm"
    target = Store(tmp_path / "target", create=True)
    with pytest.raises(BundleRejected, match=expected) as caught:
        bundle.install(path, target, expect=None, trust=trust)
    assert str(path) in str(caught.value)
    assert target.entries() == [] and bundle.installed(target) == []
    with pytest.raises(BundleRejected, match=expected):
        bundle.verify(path, trust=trust)


def test_a_signature_after_the_manifest_is_not_a_signature(tmp_path, entries, fleet):
    key, trust = fleet
    path = _unsigned(tmp_path, entries)
    bundle.sign(path, key)
    members = _members(path)
    moved = _rewrite(tmp_path / "m.tgz", [members[1], members[0], *members[2:]])
    with pytest.raises(BundleRejected, match="unsigned"):
        bundle.verify(moved, trust=trust)
    with pytest.raises(BundleRejected, match=r"'SIGNATURE\.json' is not listed"):
        bundle.verify(moved)


def test_without_trust_a_signed_bundle_installs_and_its_key_is_recorded(tmp_path, entries, fleet):
    key, _ = fleet
    path = _unsigned(tmp_path, entries)
    bundle.sign(path, key)
    target = Store(tmp_path / "target", create=True)
    info = bundle.install(path, target, expect=None)
    assert info["bundle"]["signed_by"] == key.key_id and len(target.entries()) == 2


def test_the_same_bundle_installed_again_makes_no_generation(tmp_path, entries, fleet):
    key, trust = fleet
    unsigned = _unsigned(tmp_path, entries)
    signed = bundle.sign(unsigned, key, out=tmp_path / "s.tgz").path
    target = Store(tmp_path / "target", create=True)
    first = bundle.install(unsigned, target, expect=None)
    again = bundle.install(unsigned, target, expect=None)
    same = bundle.install(signed, target, expect=None, trust=trust)  # same manifest, signed
    assert again["unchanged"] and same["unchanged"] and again["id"] == first["id"]
    assert len(bundle.installed(target)) == 1
    other = bundle.sign(_unsigned(tmp_path, entries[:1], name="o.tgz"), key).path  # later
    bundle.install(other, target, expect=None, trust=trust)
    with pytest.raises(BundleRejected, match="older than sequence"):
        bundle.install(signed, target, expect=None, trust=trust)  # back to the first: a rollback
    bundle.install(signed, target, expect=None, trust=trust, allow_downgrade=True)  # a change
    assert len(bundle.installed(target)) == 3


def test_the_signature_member_is_bounded_before_it_is_read(tmp_path, entries):
    path = _unsigned(tmp_path, entries)
    members = _members(path)
    big = ("SIGNATURE.json", b" " * (bundle_signature.MAX_BYTES + 1))
    with pytest.raises(BundleRejected, match=r"SIGNATURE\.json is 4097 bytes; limit 4096"):
        bundle.verify(_rewrite(tmp_path / "big.tgz", [big, *members]))


def test_a_manifest_that_changed_since_it_was_verified_is_never_signed(tmp_path, entries, fleet):
    key, _ = fleet
    path = _unsigned(tmp_path, entries)
    with pytest.raises(BundleRejected, match="changed since it was verified"):
        bundle_signature.sign(
            path, tmp_path / "s.tgz", key, "MANIFEST.json", 2**23, verified_sha256="0" * 64
        )
    assert not (tmp_path / "s.tgz").exists()
