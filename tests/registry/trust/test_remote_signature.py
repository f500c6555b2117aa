import pytest

from registry.trust import signing
from registry.trust.remote_signature import (
    ISSUED_BYTES,
    MAGIC,
    MAGIC2,
    OVERHEAD,
    opened,
    own,
    parts,
    seal,
    split,
    unseal,
)
from registry.trust.signing import REMOTE, SigningKey, Trust, Untrusted


@pytest.fixture
def trust(tmp_path):
    private, _ = signing.generate(tmp_path / "keys", "pod")
    return Trust.load(tmp_path / "keys", signing_key=private)


def test_a_sealed_value_opens_at_its_own_key_and_field_only(trust):
    value = seal(trust, "triton-warmup:entry:k:1", "f", b'{"a": 1}')
    assert value.startswith(MAGIC2) and len(value) == OVERHEAD + 8
    assert unseal(trust, "triton-warmup:entry:k:1", "f", value, code=True) == b'{"a": 1}'
    with pytest.raises(Untrusted, match="remote value triton-warmup:entry:k:2 field f"):
        unseal(trust, "triton-warmup:entry:k:2", "f", value, code=True)  # copied under another key
    with pytest.raises(Untrusted, match="does not verify"):
        unseal(trust, "triton-warmup:entry:k:1", "g", value, code=True)


def test_a_changed_payload_or_an_unsigned_value_is_refused(trust):
    value = seal(trust, "k", "", b"abc 3")
    with pytest.raises(Untrusted, match=f"key {trust.signer.key_id} does not verify"):
        unseal(trust, "k", "", value[:-1] + b"4", code=True)
    with pytest.raises(Untrusted, match="unsigned"):
        unseal(trust, "k", "", b"abc 3", code=True)


def test_without_a_signing_key_a_value_goes_out_as_it_is(tmp_path, trust):
    reader = Trust(trust.keys)  # trusts the pod's key, has none to sign with
    assert seal(reader, "k", "", b"x") == b"x"
    assert split(b"x") == (None, b"x")
    assert split(MAGIC + b"short") == (None, MAGIC + b"short")
    assert unseal(Trust(), "k", "", b"x", code=False) == b"x"  # no keys: data is taken
    with pytest.raises(Untrusted, match="no trusted keys are configured"):
        unseal(Trust(), "k", "", b"x", code=True)  # code is not
    assert unseal(Trust(allow_unsigned=True), "k", "", b"x", code=True) == b"x"  # opted out


def test_a_value_carries_its_issue_time_under_its_signature(trust):
    value = seal(trust, "k", "f", b"payload", issued=1234)
    assert parts(value)[1:] == (1234, b"payload")
    assert opened(trust, "k", "f", value, code=True).issued == 1234
    later = value[: OVERHEAD - ISSUED_BYTES] + (5678).to_bytes(ISSUED_BYTES, "big") + b"payload"
    with pytest.raises(Untrusted, match="does not verify"):
        opened(trust, "k", "f", later, code=True)  # the time cannot be moved
    assert seal(trust, "k", "f", b"x") != seal(trust, "k", "f", b"x", issued=1)  # now by default


def _old_envelope(signer: SigningKey, key: str, field: str, payload: bytes) -> bytes:
    """A value as pods sealed it before issue times (tw-sig1: no time)."""
    signature = signer.sign(REMOTE, key.encode() + b"\0" + field.encode() + b"\0" + payload)
    return MAGIC + signature.key_id.encode() + signature.value + payload


def test_an_old_envelope_opens_as_issued_at_time_0(tmp_path, trust):
    signer = trust.signer
    old = _old_envelope(signer, "k", "f", b"payload")
    found = opened(trust, "k", "f", old, code=True)
    assert (found.payload, found.issued, found.vouched) == (b"payload", 0, True)
    with pytest.raises(Untrusted, match="does not verify"):
        opened(trust, "k", "g", old, code=True)
    # its signature cannot be reread as a new envelope with a time taken from the payload
    stamp = b"payload"[:ISSUED_BYTES].ljust(ISSUED_BYTES, b"\0")
    forged = MAGIC2 + old[len(MAGIC) : len(MAGIC) + 80] + stamp + b"payload"
    with pytest.raises(Untrusted, match="does not verify"):
        opened(trust, "k", "f", forged, code=True)


def test_only_a_trusted_key_vouches_for_a_time(tmp_path, trust):
    value = seal(trust, "k", "", b"x", issued=99)
    assert own(trust, value).vouched and own(trust, value).issued == 99
    other, _ = signing.generate(tmp_path / "other", "other")
    lenient = Trust.load(other.parent, allow_unsigned=True)  # takes unknown keys' values
    found = opened(lenient, "k", "", value, code=True)
    assert (found.payload, found.issued, found.vouched) == (b"x", 0, False)
    assert opened(Trust(), "k", "", b"x", code=False).vouched is False  # unsigned: no time


# ---- on a real redis-server: each family of the remote tier ----------------------------

KERNEL_KEY = {"M": 64, "N": 32, "K": 32}
TRITON_KEY = "CZ4VKGKEWFV6MYQ5X5TRDJHUJU3GNRTX4GLYL7SUUERN3NQAXEGA"


@pytest.fixture
def keys(tmp_path):
    """A fleet key (the pods'), a stranger's, and folders trusting each."""
    made = {}
    for name in ("fleet", "stranger"):
        private, _ = signing.generate(tmp_path / name, name)
        made[name] = private
    return made


def pod(url, keys, *, signs="fleet", trusts="fleet", allow_unsigned=False):
    from registry.remote.tier import RemoteTier

    trust = Trust.load(
        None if trusts is None else keys[trusts].parent,
        signing_key=None if signs is None else keys[signs],
        allow_unsigned=allow_unsigned,
    )
    return RemoteTier(url, timeout_s=0.5, trust=trust)


def _entry(make_entry):
    from registry import Entry, KernelConfig, cpu_fingerprint

    return Entry.make("ag_gemm", KERNEL_KEY, cpu_fingerprint(), KernelConfig.make({"BLOCK_M": 16}))


def test_an_entry_signed_by_the_fleet_is_used_and_anything_else_refused(
    server, keys, make_entry, caplog
):
    from registry import cpu_fingerprint

    entry = _entry(make_entry)
    assert pod(server.url, keys).publish(entry)
    reader = pod(server.url, keys, signs=None)
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == entry
    doubter = pod(server.url, keys, signs=None, trusts="stranger")
    assert doubter.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) is None
    fleet_id = signing.SigningKey.load(keys["fleet"]).key_id
    assert doubter.stats.refused == 1 and doubter.stats.misses == 1
    assert any(
        f"refused: signed by unknown key {fleet_id}" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize("forgery", ["unsigned", "tampered", "moved"])
def test_a_redis_writer_without_the_key_cannot_hand_a_pod_an_entry(
    server, keys, make_entry, forgery
):
    from registry import cpu_fingerprint
    from registry.core import atomic
    from registry.remote.tier import slot_name

    entry = _entry(make_entry)
    name, field = slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest()
    payload = atomic.dumps(entry.to_json()).encode()
    if forgery == "unsigned":
        server.client.hset(name, field, payload)
    else:
        assert pod(server.url, keys).publish(entry)
        held = server.client.hget(name, field)
        if forgery == "tampered":
            server.client.hset(name, field, held.replace(b'"BLOCK_M": 16', b'"BLOCK_M": 32'))
        else:  # a value the fleet signed for another field, copied here
            other = seal(Trust.load(None, signing_key=keys["fleet"]), name, "x" + field, payload)
            server.client.hset(name, field, other)
    reader = pod(server.url, keys, signs=None)
    assert reader.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) is None
    assert reader.stats.refused == 1
    lenient = pod(server.url, keys, signs=None, allow_unsigned=True)
    found = lenient.fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint())
    assert (found is not None) == (forgery == "unsigned")  # a bad signature stays refused


def test_a_pod_without_a_signing_key_publishes_nothing_where_signatures_are_required(
    server, keys, make_entry
):
    keyless = pod(server.url, keys, signs=None)
    assert not keyless.publish(_entry(make_entry))
    assert server.client.keys("triton-warmup:*") == []
    untrusting = pod(server.url, keys, signs=None, trusts=None)  # trust not configured
    assert untrusting.publish(_entry(make_entry))


def test_a_publish_replaces_a_value_it_cannot_trust(server, keys, make_entry):
    from registry import cpu_fingerprint
    from registry.remote.tier import slot_name

    entry = _entry(make_entry)
    name, field = slot_name(entry.kernel, entry.key_json), entry.fingerprint.digest()
    server.client.hset(name, field, b'{"forged": true}')
    assert pod(server.url, keys).publish(entry)
    assert (
        pod(server.url, keys, signs=None).fetch("ag_gemm", KERNEL_KEY, cpu_fingerprint()) == entry
    )


def test_triton_files_reach_only_pods_that_trust_their_signer(server, keys):
    import hashlib

    from registry.remote import triton as remote_triton
    from registry.remote.models import blob_key

    cubin = b"\x7fELF" + bytes(range(256)) * 8
    assert remote_triton.publish(pod(server.url, keys), TRITON_KEY, "k.cubin", cubin)
    fetch = remote_triton.fetch
    assert fetch(pod(server.url, keys, signs=None), TRITON_KEY, ["k.cubin"]) == {"k.cubin": cubin}
    stranger = pod(server.url, keys, signs=None, trusts="stranger")
    assert fetch(stranger, TRITON_KEY, ["k.cubin"]) == {} and stranger.stats.refused == 1
    evil = b"\x7fELF evil"
    sha = hashlib.sha256(evil).hexdigest()
    server.client.set(blob_key(sha), evil)
    server.client.set(remote_triton.name_key(TRITON_KEY, "k.cubin"), f"{sha} {len(evil)}".encode())
    assert fetch(pod(server.url, keys, signs=None), TRITON_KEY, ["k.cubin"]) == {}


def test_a_models_index_reaches_only_pods_that_trust_its_signer(tmp_path, server, keys):
    from registry.core.fingerprint import cpu_fingerprint
    from registry.remote import models as remote_models
    from tests.registry.families.test_bundle_indexed import FILES, family, restored

    where = {"model": "mlp", "key_digest": "0123456789abcdef", "fingerprint": cpu_fingerprint()}
    source = family(tmp_path / "a")
    assert remote_models.publish(pod(server.url, keys), source, **where)
    stranger = pod(server.url, keys, signs=None, trusts="stranger")
    assert not remote_models.fetch(stranger, tmp_path / "s", **where)
    assert stranger.stats.refused == 1 and not (tmp_path / "s").exists()
    assert remote_models.fetch(pod(server.url, keys, signs=None), tmp_path / "b", **where)
    assert restored(tmp_path / "b", tmp_path / "cache") == FILES
    name = remote_models.index_key(**where)
    _, payload = split(server.client.get(name))
    server.client.set(name, payload)  # its signature stripped: unsigned
    assert not remote_models.fetch(pod(server.url, keys, signs=None), tmp_path / "c", **where)
