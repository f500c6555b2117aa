"""Bundle versions (``registry.bundles.versions``): a bundle name's sequence only moves
forward in a store, through garbage collection, rollback and a restart of the pod,
unless the operator allows the downgrade."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from registry import BundleRejected, Store
from registry.bundles import bundle, versions
from registry.trust import signing
from registry.trust.signing import SigningKey, Trust
from tests.registry.bundles.test_signature import _members, _rewrite

REPO = Path(__file__).parents[3]


@pytest.fixture
def release(tmp_path):
    """The release key that signs the tests' bundles, and the trust that holds it: only
    a sequence a trusted key vouched for moves a name's mark."""
    private, _ = signing.generate(tmp_path / "release-keys", "release")
    return SigningKey.load(private), Trust.load(tmp_path / "release-keys")


@pytest.fixture
def install(release):
    """``bundle.install`` as a pod trusting the release key does it."""

    def run(path, store, **options):
        options.setdefault("trust", release[1])
        return bundle.install(path, store, expect=None, **options)

    return run


SIGNED = object()  # make's default: signed by the release key


@pytest.fixture
def make(tmp_path, make_entry, release):
    """``make(sequence, m=..., name=...)``: a bundle of one entry at that sequence, signed
    by the release key (``signer=None``: unsigned)."""

    def build(sequence, *, m=1024, name="tp2", signer=SIGNED):
        signer = release[0] if signer is SIGNED else signer
        out = tmp_path / f"{name}-{sequence}-{m}.tgz"
        entries = [make_entry(m=m)]
        bundle.create(
            out,
            name=name,
            version=f"v{sequence}",
            entries=entries,
            sequence=sequence,
            signer=signer,
        )
        return out

    return build


def _ms(path):
    return [e.key["M"] for e in Store(path).entries()]


def test_the_default_sequence_grows_with_creation_and_a_given_one_is_kept(tmp_path, make_entry):
    made = []
    for i in range(3):  # within a millisecond or not, each later one is higher
        out = tmp_path / f"{i}.tgz"
        made.append(bundle.create(out, name="n", version="1", entries=[make_entry()])["sequence"])
    assert made == sorted(made) and len(set(made)) == 3 and made[0] > 1_700_000_000_000
    assert bundle.verify(tmp_path / "2.tgz").sequence == made[2]
    bundle.create(tmp_path / "x.tgz", name="n", version="1", entries=[make_entry()], sequence=7)
    assert bundle.verify(tmp_path / "x.tgz").sequence == 7
    with pytest.raises(Exception, match="out of range"):
        bundle.create(
            tmp_path / "y.tgz", name="n", version="1", entries=[make_entry()], sequence=-1
        )


def test_a_bundle_made_before_sequences_reads_as_0_and_a_bad_one_is_refused(tmp_path, make):
    members = dict(_members(make(5)))
    manifest = json.loads(members["MANIFEST.json"])
    for value, expected in ((None, 0), ("5", "not an int"), (True, "not an int"), (2**63, "0 to")):
        if value is None:
            manifest.pop("sequence")
        else:
            manifest["sequence"] = value
        members["MANIFEST.json"] = json.dumps(manifest).encode()
        path = _rewrite(tmp_path / "edited.tgz", list(members.items()))
        if value is None:
            assert bundle.verify(path).sequence == expected
        else:
            with pytest.raises(BundleRejected, match=expected):
                bundle.verify(path)


def test_the_signature_covers_the_sequence(tmp_path, make):
    private, _ = signing.generate(tmp_path / "keys", "fleet")
    path = make(5, signer=SigningKey.load(private))
    trust = Trust.load(tmp_path / "keys")
    assert bundle.verify(path, trust=trust).sequence == 5
    members = dict(_members(path))
    manifest = json.loads(members["MANIFEST.json"])
    manifest["sequence"] = 10**12  # an old bundle passed off as the newest
    members["MANIFEST.json"] = json.dumps(manifest).encode()
    with pytest.raises(BundleRejected, match="signature"):
        bundle.verify(_rewrite(tmp_path / "bumped.tgz", list(members.items())), trust=trust)


def test_an_older_bundle_is_refused_in_one_line_unless_the_downgrade_is_allowed(
    install, tmp_path, make, caplog
):
    store = Store(tmp_path / "registry", create=True)
    install(make(10, m=2048), store)
    current = store.current_generation()
    with pytest.raises(BundleRejected) as refused:
        install(make(9, m=1024), store)
    text = str(refused.value)
    assert len(text.splitlines()) == 1
    for part in ("'tp2'", "sequence 9", "older than sequence 10", "--allow-downgrade"):
        assert part in text
    assert store.current_generation() == current and _ms(store.root) == [2048]
    with caplog.at_level(logging.WARNING, logger="registry.bundles.versions"):
        info = install(make(9, m=1024), store, allow_downgrade=True)
    assert "--allow-downgrade" in caplog.text and "sequence 9" in caplog.text
    assert info["allowed_downgrade"]["installed"]["sequence"] == 10
    assert store.record().extra["allowed_downgrade"]["sequence"] == 9
    with pytest.raises(BundleRejected, match="older than sequence 9"):  # the operator's mark
        install(make(8, m=512), store)
    install(make(10, m=4096), store)  # the name goes on from the sequence chosen
    assert sorted(_ms(store.root)) == [1024, 2048, 4096]


def test_the_same_sequence_with_other_content_is_a_replay(install, tmp_path, make):
    store = Store(tmp_path / "registry", create=True)
    first = make(10, m=2048)
    install(first, store)
    with pytest.raises(BundleRejected, match="sequence 10 is installed already with other"):
        install(make(10, m=1024), store)
    assert install(first, store)["unchanged"]
    other_name = make(1, m=1024, name="other")  # each name has its own order
    assert install(other_name, store)["bundle"]["sequence"] == 1


def test_bundles_made_before_sequences_replace_each_other_until_one_has_one(
    install, tmp_path, make
):
    store = Store(tmp_path / "registry", create=True)
    legacy = []
    for m in (1024, 2048):
        path = make(1, m=m)
        members = dict(_members(path))
        manifest = json.loads(members["MANIFEST.json"])
        manifest.pop("sequence")
        members["MANIFEST.json"] = json.dumps(manifest).encode()
        legacy.append(_rewrite(tmp_path / f"legacy-{m}.tgz", list(members.items())))
    unsigned = Trust()  # tuned configs alone: taken unsigned with no key configured
    install(legacy[1], store, trust=unsigned)
    install(legacy[0], store, trust=unsigned)  # no order claimed: as before
    install(make(5, m=4096), store)
    with pytest.raises(BundleRejected, match="sequence 0 is older than sequence 5"):
        install(legacy[1], store, trust=unsigned)


def test_rollback_is_the_way_back_and_the_newer_bundle_may_come_again(install, tmp_path, make):
    store = Store(tmp_path / "registry", create=True)
    old, new = make(9, m=1024), make(10, m=2048)
    install(old, store)
    install(new, store)
    bundle.rollback(store)
    assert _ms(store.root) == [1024]
    with pytest.raises(BundleRejected, match="older than sequence 10"):
        install(old, store)  # a rollback lowers no mark
    assert not install(new, store).get("unchanged")
    assert sorted(_ms(store.root)) == [1024, 2048]


def test_the_mark_outlives_the_generations_that_recorded_it(install, tmp_path, make, make_entry):
    store = Store(tmp_path / "registry", create=True, keep_generations=2)
    install(make(10, m=2048), store)
    for i in range(3):  # other names' installs: the record of sequence 10 is collected
        install(make(i + 1, m=100 + i, name=f"other{i}"), store)
    names = [g.bundle.get("name") for g in store.generations()]
    assert "tp2" not in names
    marks = versions.read_marks(store.root)
    assert marks["tp2"].sequence == 10 and marks["other2"].sequence == 3
    with pytest.raises(BundleRejected, match="older than sequence 10"):
        install(make(9, m=1024), store)


def test_an_unreadable_marks_file_leaves_the_kept_records(install, tmp_path, make, caplog):
    store = Store(tmp_path / "registry", create=True)
    install(make(10, m=2048), store)
    (store.root / versions.MARKS_FILE).write_text("{not json")
    with pytest.raises(BundleRejected, match="older than sequence 10"):  # from the record
        install(make(9, m=1024), store)
    assert "unreadable" in caplog.text
    install(make(11, m=4096), store)  # and the next install rewrites it
    assert versions.read_marks(store.root)["tp2"].sequence == 11


def test_the_refusal_holds_in_a_new_process_on_the_same_volume(install, tmp_path, make):
    """A pod restarted on the same volume: the CLI in a fresh interpreter exits 2."""
    store = tmp_path / "registry"
    install(make(10, m=2048), Store(store, create=True))
    older = make(9, m=1024)
    command = [sys.executable, "-m", "warmup", "registry", "--store", str(store), "bundle"]
    command += ["install", str(older), "--fingerprint", "none"]
    command += ["--trusted-keys", str(tmp_path / "release-keys")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "older than sequence 10" in done.stderr
    assert _ms(store) == [2048]
    forced = subprocess.run(
        [*command, "--allow-downgrade"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert forced.returncode == 0, forced.stderr
    assert "downgrade allowed" in forced.stdout and sorted(_ms(store)) == [1024, 2048]


def test_only_a_sequence_a_trusted_key_vouched_for_moves_the_mark(install, tmp_path, make):
    """An unsigned bundle (taken where the trust allows it) is checked against the mark
    but never raises it: anyone could have written its sequence, and one written too
    high would freeze the name."""
    store = Store(tmp_path / "registry", create=True)
    install(make(10, m=2048), store)
    with pytest.raises(BundleRejected, match="older than sequence 10"):
        install(make(9, m=1024, signer=None), store, trust=Trust())  # checked all the same
    pinned = make(2**63 - 1, m=1024, signer=None)  # the highest there is, unsigned
    install(pinned, store, trust=Trust())
    assert versions.read_marks(store.root)["tp2"].sequence == 10
    assert install(make(11, m=4096), store)["bundle"]["sequence"] == 11  # not frozen
    assert store.record().extra["bundle"]["vouched"] is True
