"""``registry bundle ...`` and ``registry keys generate`` (``registry.cli.bundle``): make,
check, sign, install and list bundles, and the keys that sign them."""

import json

import pytest

from registry import Store
from registry.bundles import bundle
from tests.registry.cli.test_main import cli, run

pytestmark = pytest.mark.usefixtures("isolated")


def test_bundle_create_verify_install_list_rollback(capsys, store, tmp_path, h200):
    fp_file = tmp_path / "fp.json"
    fp_file.write_text(json.dumps(h200.to_json()))
    out_file = tmp_path / "b.tgz"
    args = ["bundle", "create", str(out_file), "--name", "tp2", "--version", "3"]
    assert cli(capsys, store.root, *args)[0] == 0
    code, out, _ = run(capsys, "registry", "bundle", "verify", str(out_file))
    assert code == 0 and "OK  tp2 3  2 entries" in out
    target = tmp_path / "target"
    install = ["bundle", "install", str(out_file), "--fingerprint", str(fp_file)]
    code, out, _ = cli(capsys, target, "--create-store", "--json", *install)
    assert code == 0 and json.loads(out)["entries"] == 2
    code, out, _ = cli(capsys, target, "bundle", "list")
    assert code == 0 and "tp2" in out and "install" in out
    code, out, _ = cli(capsys, target, "rollback")
    assert code == 0 and "rolled back" in out and len(Store(target)) == 0


def test_install_with_the_wrong_fingerprint_fails_with_one_line(capsys, store, tmp_path):
    out_file = tmp_path / "b.tgz"
    bundle.create(out_file, name="tp2", version="1", entries=store.entries())
    install = ["--create-store", "bundle", "install", str(out_file), "--fingerprint", "cpu"]
    code, _, err = cli(capsys, tmp_path / "t", *install)
    assert code == 2 and err.startswith("triton-warmup: error: Bundle") and "gpu_name" in err
    assert len(err.strip().splitlines()) == 1 and "--force" in err
    code, _, _ = cli(capsys, tmp_path / "t", *install, "--force")
    assert code == 0 and len(Store(tmp_path / "t")) == 2


def test_json_after_a_bundle_command(capsys, store, tmp_path):
    out_file = tmp_path / "b.tgz"
    code, out, _ = cli(
        capsys,
        store.root,
        "bundle",
        "create",
        str(out_file),
        "--name",
        "n",
        "--version",
        "1",
        "--json",
    )
    assert code == 0 and json.loads(out)["name"] == "n"
    code, out, _ = run(capsys, "registry", "bundle", "verify", str(out_file), "--json")
    assert code == 0 and json.loads(out)["version"] == "1"


def test_keys_sign_and_verify_with_trusted_keys(capsys, store, tmp_path):
    keys = tmp_path / "keys"
    code, out, _ = run(capsys, "registry", "keys", "generate", "--out", str(keys), "--name", "ci")
    assert code == 0 and (keys / "ci.key").exists() and (keys / "ci.pub").exists()
    key_id = out.split("(key ")[1].rstrip(")\n")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "ci.pub").write_bytes((keys / "ci.pub").read_bytes())
    made = tmp_path / "b.tgz"
    assert (
        cli(capsys, store.root, "bundle", "create", str(made), "--name", "a", "--version", "1")[0]
        == 0
    )
    verify = ["registry", "bundle", "verify", "--trusted-keys", str(trusted)]
    code, _, err = run(capsys, *verify, str(made))
    assert code == 2 and f"Bundle '{made}' rejected: unsigned" in err
    assert len(err.strip().splitlines()) == 1
    code, out, _ = run(capsys, *verify, "--allow-unsigned", str(made))
    assert code == 0 and "unsigned (unsigned artifacts allowed" in out
    signed = tmp_path / "s.tgz"
    args = ["registry", "bundle", "sign", str(made), "--key", str(keys / "ci.key")]
    code, out, _ = run(capsys, *args, "--out", str(signed))
    assert code == 0 and f"with key {key_id}" in out
    code, out, _ = run(capsys, *verify, str(signed))
    assert code == 0 and f"signed by trusted key {key_id}" in out
    code, out, _ = run(capsys, "registry", "bundle", "verify", str(signed))
    assert code == 0 and f"signed by key {key_id}, not checked" in out
    install = ["registry", "--store", str(tmp_path / "target"), "--create-store", "bundle"]
    install += ["install", "--fingerprint", "none", "--trusted-keys", str(trusted)]
    assert run(capsys, *install, str(made))[0] == 2
    assert not (tmp_path / "target" / "current").exists()
    code, out, _ = run(capsys, *install, str(signed))
    assert code == 0 and "installed a 1 as generation" in out
    code, out, _ = run(capsys, *install, str(signed))
    assert code == 0 and "is installed already as generation" in out


def test_a_bad_key_or_keys_folder_is_bad_input(capsys, store, tmp_path):
    made = tmp_path / "b.tgz"
    assert (
        cli(capsys, store.root, "bundle", "create", str(made), "--name", "a", "--version", "1")[0]
        == 0
    )
    code, _, err = run(
        capsys, "registry", "bundle", "verify", "--trusted-keys", str(tmp_path / "no"), str(made)
    )
    assert code == 2 and "--trusted-keys" in err and "does not exist" in err
    (tmp_path / "junk.key").write_text("junk")
    (tmp_path / "junk.key").chmod(0o600)
    code, _, err = run(
        capsys, "registry", "bundle", "sign", str(made), "--key", str(tmp_path / "junk.key")
    )
    assert code == 2 and "junk.key is not an unencrypted PEM private key" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(
        capsys, "registry", "bundle", "verify", "--trusted-keys", str(empty), str(made)
    )
    assert code == 2 and "holds no public key" in err


def test_sequences_are_shown_and_an_older_bundle_needs_allow_downgrade(capsys, store, tmp_path):
    from registry.trust import signing

    private, _ = signing.generate(tmp_path / "release", "release")  # a vouched sequence
    made = {}
    for sequence in (5, 4):
        made[sequence] = tmp_path / f"b{sequence}.tgz"
        create = ["bundle", "create", str(made[sequence]), "--name", "tp2", "--version", "x"]
        create += ["--sign-key", str(private)]
        code, out, _ = cli(capsys, store.root, *create, "--sequence", str(sequence))
        assert code == 0 and f"sequence {sequence}, signed by key" in out
    code, out, _ = run(capsys, "registry", "bundle", "verify", str(made[4]))
    assert code == 0 and "  sequence 4\n" in out
    code, _, err = cli(
        capsys,
        store.root,
        "bundle",
        "create",
        "x.tgz",
        "--name",
        "n",
        "--version",
        "1",
        "--sequence",
        "-1",
    )
    assert code == 2 and "--sequence is -1" in err
    target = tmp_path / "target"
    install = ["--create-store", "bundle", "install", "--fingerprint", "none"]
    install += ["--trusted-keys", str(tmp_path / "release")]
    assert cli(capsys, target, *install, str(made[5]))[0] == 0
    code, _, err = cli(capsys, target, *install, str(made[4]))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'tp2' sequence 4 is older than sequence 5" in err and "--allow-downgrade" in err
    code, out, _ = cli(capsys, target, "--json", "bundle", "list")
    assert [row["sequence"] for row in json.loads(out)] == [5]
    assert cli(capsys, target, "rollback")[0] == 0  # the way back; the newer may come again
    assert cli(capsys, target, *install, str(made[4]))[0] == 2
    assert cli(capsys, target, *install, str(made[5]))[0] == 0
    code, out, _ = cli(capsys, target, *install, "--allow-downgrade", str(made[4]))
    assert code == 0 and out.rstrip().endswith("sequence 4 (downgrade allowed)")
    assert cli(capsys, target, *install, str(made[5]))[0] == 0  # on from the chosen 4
    code, out, _ = cli(capsys, target, "bundle", "list")
    assert code == 0 and "SEQUENCE" in out and "downgrade allowed" in out


def test_an_install_removes_the_stage_a_dead_install_left_in_its_folders(capsys, store, tmp_path):
    made = tmp_path / "b.tgz"
    assert (
        cli(capsys, store.root, "bundle", "create", str(made), "--name", "a", "--version", "1")[0]
        == 0
    )
    inductor = tmp_path / "volume" / "inductor"
    dead = inductor / ".bundle-dead"  # its lock file is there and nobody holds it
    (dead / "blobs").mkdir(parents=True)
    (dead / ".lock").touch()
    install = ["--create-store", "bundle", "install", "--fingerprint", "none"]
    code, _, err = cli(capsys, tmp_path / "t", *install, "--inductor", str(inductor), str(made))
    assert code == 0, err
    assert not dead.exists()
