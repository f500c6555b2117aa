import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from registry.trust import signing
from registry.trust.signing import KeyFileError, Signature, SigningKey, Trust, Untrusted


@pytest.fixture
def pair(tmp_path):
    private, _ = signing.generate(tmp_path / "keys", "fleet")
    return SigningKey.load(private), tmp_path / "keys"


def test_generate_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path):
    private, public = signing.generate(tmp_path, "pod")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    key = SigningKey.load(private)
    assert signing.key_id(signing.load_public(public)) == key.key_id
    assert len(key.key_id) == signing.KEY_ID_CHARS
    with pytest.raises(KeyFileError, match="never overwritten"):
        signing.generate(tmp_path, "pod")
    with pytest.raises(KeyFileError, match="plain file name"):
        signing.generate(tmp_path, "../up")


def test_trust_required_accepts_only_a_trusted_valid_signature(pair, tmp_path):
    key, folder = pair
    trust = Trust.load(folder)
    assert trust.required and key.key_id in trust.keys
    payload = b"what the manifest says"
    trust.check("bundle b", "bundle", payload, key.sign("bundle", payload))
    with pytest.raises(Untrusted, match="unsigned"):
        trust.check("bundle b", "bundle", payload, None)
    with pytest.raises(Untrusted, match=f"by key {key.key_id} does not verify"):
        trust.check("bundle b", "bundle", payload + b"!", key.sign("bundle", payload))
    private, _ = signing.generate(tmp_path / "other", "stranger")
    stranger = SigningKey.load(private)
    with pytest.raises(Untrusted, match=f"unknown key {stranger.key_id}"):
        trust.check("bundle b", "bundle", payload, stranger.sign("bundle", payload))


def test_a_signature_is_valid_for_its_domain_only(pair):
    key, folder = pair
    trust = Trust.load(folder)
    made_for_remote = key.sign("remote", b"x")
    with pytest.raises(Untrusted, match="does not verify"):
        trust.check("bundle b", "bundle", b"x", made_for_remote)


def test_the_opt_out_accepts_unsigned_and_unknown_but_never_a_bad_trusted_signature(pair):
    key, folder = pair
    trust = Trust.load(folder, allow_unsigned=True)
    assert not trust.required and "ALLOW_UNSIGNED" in trust.describe()
    trust.check("v", "remote", b"x", None)
    trust.check("v", "remote", b"x", Signature("0" * 16, b"\0" * 64))
    with pytest.raises(Untrusted):
        trust.check("v", "remote", b"x", key.sign("remote", b"y"))


def test_no_trust_configured_refuses_code_and_takes_data_and_says_so(pair):
    key, _ = pair
    trust = Trust()
    assert not trust.required and trust.mode == "code-refused"
    assert "code from bundles and the remote tier refused" in trust.describe()
    trust.check("v", "bundle", b"x", None, code=False)  # tuned configs run no code
    with pytest.raises(
        Untrusted, match=r"^m refused: unsigned, and no trusted keys .*ALLOW_UNSIGNED"
    ):
        trust.check("m", "bundle", b"x", None)
    signed = key.sign("remote", b"x")  # signed, but by nobody this pod trusts
    with pytest.raises(Untrusted, match=f"signed by {key.key_id}, and no trusted keys"):
        trust.check("m", "remote", b"x", signed, code=True)
    assert trust.sign("bundle", b"x") is None


def test_the_opt_out_takes_unsigned_code_and_says_so(pair):
    key, _ = pair
    trust = Trust(allow_unsigned=True)
    assert trust.mode == "unsigned-allowed" and "ALLOW_UNSIGNED=true" in trust.describe()
    trust.check("m", "bundle", b"x", None)
    trust.check("m", "remote", b"x", key.sign("remote", b"x"))  # no key to check it against


def test_with_keys_the_mode_is_signed_and_data_needs_a_signature_too(pair):
    key, _ = pair
    trust = Trust({key.key_id: key.public_key()})
    assert trust.mode == "signed"
    with pytest.raises(Untrusted, match="unsigned; a signature by a trusted key is required"):
        trust.check("e", "remote", b"x", None, code=False)
    trust.check("e", "remote", b"x", key.sign("remote", b"x"), code=False)


def test_trusted_keys_follow_a_secrets_links_and_skip_its_dot_files(pair, tmp_path):
    """A Kubernetes Secret volume: each file a link into ..data, itself a link."""
    key, folder = pair
    secret = tmp_path / "secret"
    (secret / "..2026_11_28").mkdir(parents=True)
    (secret / "..2026_11_28" / "fleet.pub").write_bytes((folder / "fleet.pub").read_bytes())
    os.symlink("..2026_11_28", secret / "..data")
    os.symlink("..data/fleet.pub", secret / "fleet.pub")
    assert list(signing.trusted_keys(secret)) == [key.key_id]


def test_a_keys_folder_that_cannot_be_used_is_one_clear_error(tmp_path):
    with pytest.raises(KeyFileError, match="does not exist"):
        signing.trusted_keys(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError, match="holds no public key"):
        signing.trusted_keys(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.pub").write_text("not a key")
    with pytest.raises(KeyFileError, match=r"x\.pub is not a PEM public key"):
        signing.trusted_keys(bad)
    (bad / "x.pub").write_bytes(b"A" * (signing.MAX_KEY_FILE_BYTES + 1))
    with pytest.raises(KeyFileError, match="cannot be read"):
        signing.trusted_keys(bad)


def test_a_key_of_another_algorithm_is_refused(tmp_path):
    other = ec.generate_private_key(ec.SECP256R1())
    pem = other.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "ec.pub").write_bytes(pem)
    with pytest.raises(KeyFileError, match="need Ed25519"):
        signing.load_public(tmp_path / "ec.pub")
    private = other.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (tmp_path / "ec.key").write_bytes(private)
    (tmp_path / "ec.key").chmod(0o600)
    with pytest.raises(KeyFileError, match="need Ed25519"):
        SigningKey.load(tmp_path / "ec.key")
    (tmp_path / "junk.key").write_text("junk")
    (tmp_path / "junk.key").chmod(0o600)
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        SigningKey.load(tmp_path / "junk.key")


def test_release_keys_for_bundles_keep_a_pods_key_from_signing_one(tmp_path):
    pod_private, _ = signing.generate(tmp_path / "pods", "pod")
    release_private, _ = signing.generate(tmp_path / "release", "release")
    pod, release = SigningKey.load(pod_private), SigningKey.load(release_private)
    trust = Trust.load(tmp_path / "pods", bundle_keys_dir=tmp_path / "release")
    trust.check("v", "remote", b"x", pod.sign("remote", b"x"))
    trust.check("b", "bundle", b"m", release.sign("bundle", b"m"))
    with pytest.raises(Untrusted, match=f"unknown key {pod.key_id}"):
        trust.check("b", "bundle", b"m", pod.sign("bundle", b"m"))  # a compromised pod's
    with pytest.raises(Untrusted, match=f"unknown key {release.key_id}"):
        trust.check("v", "remote", b"x", release.sign("remote", b"x"))
    assert "bundles by 1 release keys" in trust.describe()
    only_bundles = Trust.load(None, bundle_keys_dir=tmp_path / "release")
    assert only_bundles.requires("bundle") and not only_bundles.requires("remote")


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o440, 0o640, 0o700])
def test_a_private_key_only_its_owner_writes_and_no_stranger_reads_loads(tmp_path, mode):
    private, _ = signing.generate(tmp_path, "k")
    private.chmod(mode)
    assert SigningKey.load(private).key_id


@pytest.mark.parametrize(
    "mode,says",
    [(0o644, "others can read it"), (0o604, "others can read it"), (0o620, "its owner can write"),
     (0o602, "its owner can write"), (0o666, "others can read it")],
)  # fmt: skip
def test_a_private_key_others_can_read_or_write_is_refused_as_ssh_does(tmp_path, mode, says):
    private, _ = signing.generate(tmp_path, "k")
    private.chmod(mode)
    with pytest.raises(KeyFileError, match=f"has mode {mode:04o}: .*{says}.*chmod 0600"):
        SigningKey.load(private)


def test_a_secrets_signing_key_is_checked_by_the_mode_of_the_file_it_links_to(tmp_path):
    """A Secret's ``signing.key`` is a link (mode 0777 itself) into ``..data``."""
    private, _ = signing.generate(tmp_path / "made", "k")
    secret = tmp_path / "secret"
    (secret / "..2026_12_08").mkdir(parents=True)
    target = secret / "..2026_12_08" / "signing.key"
    target.write_bytes(private.read_bytes())
    os.symlink("..2026_12_08", secret / "..data")
    os.symlink("..data/signing.key", secret / "signing.key")
    target.chmod(0o440)  # defaultMode 0440: the pod's group reads it
    assert SigningKey.load(secret / "signing.key").key_id
    target.chmod(0o644)  # the Secret's default mode
    with pytest.raises(KeyFileError, match="mode 0644"):
        SigningKey.load(secret / "signing.key")
