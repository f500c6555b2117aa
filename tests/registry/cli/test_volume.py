"""The registry commands and the volume (``registry.cli.common``: ``Place``,
``named_volume``, ``fill_family_defaults``): ``--volume`` or ``--store`` names where they
read and write, before or after the command, and nothing is written outside it."""

import os
import shutil

import pytest

from registry import Store
from registry.bundles import bundle
from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from registry.trust.signing import Trust
from tests.conftest import error_line
from tests.registry.cli.test_main import run


def _model_files(family, model="mlp"):
    """One compiled model's files in the Inductor family folder ``family``."""
    cache = family.parent / f"{family.name}-src-{model}"
    for rel in ("fxgraph/ab/fabc/entry", "ab/cabc.so"):
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(os.urandom(64))
    fp = cpu_fingerprint()
    inductor_cache.save(cache, family, model=model, key_digest="0" * 16, key={}, fingerprint=fp)


@pytest.fixture
def models_bundle(tmp_path_factory):
    """A bundle of one compiled model, made outside the test's folder."""
    made = tmp_path_factory.mktemp("made")
    _model_files(made / "inductor")
    out = made / "models.tgz"
    bundle.create(
        out, name="models", version="1", entries=[], roots={"inductor": made / "inductor"}
    )
    return out


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


NAMED = {  # how the new volume is named: the option, before or after the command
    "store": ["--store", "{vol}/registry"],
    "volume-before": ["--volume", "{vol}"],
    "volume-after": [],
}


@pytest.mark.parametrize("how", NAMED)
def test_an_install_writes_inside_the_named_volume_and_ls_shows_it(
    capsys, tmp_path, monkeypatch, models_bundle, how
):
    cwd, volume = tmp_path / "cwd", tmp_path / "newvol"
    cwd.mkdir()
    volume.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv(
        "TRITON_WARMUP_VOLUME", raising=False
    )  # not the pod's: only what the command names
    named = [a.format(vol=volume) for a in NAMED[how]]
    after = ["--volume", str(volume)] if how == "volume-after" else []
    install = ["bundle", "install", str(models_bundle), "--allow-unsigned", "--fingerprint", "none"]
    code, out, err = run(capsys, "registry", *named, *install, *after)
    assert code == 0, err
    assert "1 compiled model indexes" in out
    assert _files(cwd) == []  # nothing written outside the volume (no ./demo-volume)
    assert (volume / "inductor" / "models" / "mlp").is_dir()
    code, out, _ = run(capsys, "registry", *named, "ls", *after)
    assert code == 0 and f"1 compiled models in {volume / 'inductor'}" in out
    assert _files(cwd) == []


def test_a_store_outside_a_volume_takes_no_compiled_models_unless_told_where(
    capsys, tmp_path, monkeypatch, models_bundle
):
    monkeypatch.chdir(tmp_path)
    lone = tmp_path / "lone"
    install = ["bundle", "install", str(models_bundle), "--allow-unsigned", "--fingerprint", "none"]
    code, _, err = run(capsys, "registry", "--store", str(lone), "--create-store", *install)
    assert code == 2 and "inductor" in error_line(err)
    assert _files(tmp_path) == []  # refused whole: no store, no ./demo-volume
    code, _, err = run(
        capsys, "registry", "--store", str(lone), "--create-store", *install,
        "--inductor", str(tmp_path / "models"),
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "models" / "models" / "mlp").is_dir()


@pytest.mark.parametrize(
    "argv",
    [["ls"], ["show", "M1"], ["bundle", "list"], ["rollback"]],
)
def test_a_store_command_without_a_volume_named_exits_2_naming_the_option(
    capsys, tmp_path, monkeypatch, argv
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRITON_WARMUP_VOLUME", raising=False)
    code, out, err = run(capsys, "registry", *argv)
    line = error_line(err)
    assert code == 2 and out == "" and "--volume" in line and "TRITON_WARMUP_VOLUME" in line
    assert _files(tmp_path) == []  # no demo default: nothing read or made in the cwd


def test_commands_without_a_store_need_no_volume(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRITON_WARMUP_VOLUME", raising=False)
    assert run(capsys, "registry", "fingerprint", "--fingerprint", "cpu")[0] == 0
    assert run(capsys, "registry", "keys", "generate", "--out", str(tmp_path / "k"))[0] == 0
    made = [tmp_path / "k", tmp_path / "k" / "signing.key", tmp_path / "k" / "signing.pub"]
    assert _files(tmp_path) == [p.relative_to(tmp_path) for p in made]


@pytest.mark.parametrize("where", ["top", "registry", "command"])
def test_store_options_are_taken_before_or_after_the_command(capsys, store, where):
    options = ["--store", str(store.root)]
    argv = {
        "top": ["registry", *options, "ls"],
        "registry": ["registry", "ls", *options],
        "command": ["registry", "bundle", "list", *options],
    }[where]
    code, out, err = run(capsys, *argv)
    assert code == 0, (err and str(store.root) in out) or "GENERATION" in out


@pytest.fixture
def volume_of_models(tmp_path, store):
    """A volume with a store of two entries and one compiled model."""
    volume = tmp_path / "vol"
    Store(volume / "registry", create=True).put_many(store.entries())
    _model_files(volume / "inductor")
    return volume


def _created(capsys, volume, out, *more):
    argv = ["registry", "--volume", str(volume), "--json", "bundle", "create", str(out)]
    code, printed, err = run(capsys, *argv, "--name", "n", "--version", "1", *more)
    assert code == 0, err
    return bundle.describe(__import__("json").loads(printed)["members"])


def test_bundle_create_carries_the_volumes_compiled_models_unless_left_out(
    capsys, tmp_path, volume_of_models
):
    out = tmp_path / "b.tgz"
    assert "1 compiled model indexes" in _created(capsys, volume_of_models, out)
    for left_out in (["--without", "inductor"], ["--configs-only"]):
        assert "0 compiled model indexes" in _created(capsys, volume_of_models, out, *left_out)
    other = tmp_path / "other-models"
    _model_files(other, model="big")
    carried = _created(capsys, volume_of_models, out, "--inductor", str(other))
    assert "1 compiled model indexes" in carried  # from the folder given, instead of the volume's
    verified = bundle.verify(out, trust=Trust(allow_unsigned=True))
    assert any("models/big/" in m for m in verified.manifest["members"])


def test_ls_lists_the_volumes_packages_and_declared_folders_too(capsys, volume_of_models):
    code, out, _ = run(capsys, "registry", "ls", "--volume", str(volume_of_models))
    assert code == 0 and "compiled packages" not in out  # a family the volume does not use
    shutil.copytree(volume_of_models / "inductor", volume_of_models / "packages")
    code, out, _ = run(capsys, "registry", "ls", "--volume", str(volume_of_models))
    assert "1 compiled models in" in out and "1 compiled packages in" in out
    code, out, _ = run(capsys, "registry", "--json", "ls", "--volume", str(volume_of_models))
    assert len(__import__("json").loads(out)["compiled_packages"]) == 1


def test_a_store_and_a_volume_that_disagree_are_refused_before_anything_is_written(
    capsys, tmp_path, models_bundle
):
    a, b = tmp_path / "A", tmp_path / "B"
    b.mkdir()
    install = ["bundle", "install", str(models_bundle), "--allow-unsigned", "--fingerprint", "none"]
    argv = ["registry", "--store", str(a / "registry"), "--create-store", *install]
    code, _, err = run(capsys, *argv, "--volume", str(b))
    assert code == 2 and "is not the registry of --volume" in error_line(err)
    assert not a.exists() and list(b.iterdir()) == []
    code, _, err = run(capsys, *argv, "--volume", str(a))  # the two of one volume: taken
    assert code == 0, err


def test_a_model_named_that_the_volume_does_not_hold_is_bad_input(
    capsys, tmp_path, volume_of_models
):
    argv = ["registry", "--volume", str(volume_of_models), "bundle", "create", str(tmp_path / "b")]
    code, _, err = run(capsys, *argv, "--name", "n", "--version", "1", "--model", "nosuch")
    assert code == 2 and "no artifacts of model nosuch" in error_line(err)
