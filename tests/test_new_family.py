"""The measure of [5.1]: a new cache family that keeps one pod folder is its module and
nothing else. The module is dropped into a plug-in folder on the families' path, then
restored, saved, harvested, bundled (create and install) and explained through the
public entry points: the settings, ``warmup.caches.families``' loops and the ``registry`` CLI."""

from __future__ import annotations

import json
import sys

import pytest

from registry import families
from registry.caches.triton_cache import Origin
from registry.core.fingerprint import cpu_fingerprint
from registry.families import Host, Sources
from warmup import cli
from warmup.caches import families as warm
from warmup.core.services import Services
from warmup.core.settings import Settings

NOTES = '''
"""Notes: one pod folder of files, kept on the volume at <volume>/notes."""
from pathlib import Path, PurePosixPath
import shutil

from registry.families.bundle_parts import BundlePart, Packed
from registry.core.errors import BundleRejected
from registry.core.explain import predict
from registry.families.base import BundleOption, Family, Moved, PodFolder

FOLDER = PodFolder("notes_dir", "families/notes", "the server's notes", server_env="NOTES")


class NoteFiles(BundlePart):
    prefix, what, counted, option = "notes/", "notes", "notes", "notes"
    carries_code = False  # text: a bundle of notes alone installs with no key configured

    def pack(self, root, *, only=None):
        files = sorted(p for p in root.rglob("*") if p.is_file())
        return Packed({self.prefix + p.relative_to(root).as_posix(): p for p in files})

    def limit(self, label, name, limits):
        if ".." in PurePosixPath(name).parts:
            raise BundleRejected(label, f"note '{name}' climbs")
        return "note", limits.max_member_bytes


def copy(source, target):
    copied = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        dest = target / path.relative_to(source)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            copied += 1
    return copied


class Notes(Family):
    name, order = "notes", 60
    folders = (FOLDER,)
    bundled = NoteFiles()
    option = BundleOption("--notes", carries="also carry these notes", goes="where notes go")

    def volume_root(self, volume):
        return volume.root / "notes"

    def restore(self, scope):
        assert set(scope.pod) == {"notes_dir"}, scope.pod  # only what it declared
        root = self.volume_root(scope.volume)
        copied = copy(root, scope.folder("notes_dir")) if root.is_dir() else 0
        return Moved(self.name, copied=copied)

    def save(self, scope):
        copied = copy(scope.folder("notes_dir"), self.volume_root(scope.volume))
        return Moved(self.name, copied=copied)

    def watched(self, scope):
        return [scope.folder("notes_dir")]

    def harvest(self, scope):
        return self.save(scope)

    def explain(self, scope, host, sources):
        root = self.volume_root(scope.volume)
        held = [{}] * sum(1 for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        return predict(self.name, held)


FAMILY = Notes()
'''


@pytest.fixture
def notes(tmp_path, monkeypatch):
    """The notes family, found beside the shipped ones."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "zz_notes.py").write_text(NOTES)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(plugins)])
    families.every.cache_clear()
    yield families.named("notes")
    families.every.cache_clear()
    sys.modules.pop("registry.families.zz_notes", None)


def files(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()
    }


def test_a_family_of_one_pod_folder_is_its_module_and_nothing_else(
    notes, tmp_path, monkeypatch, capsys
):
    volume, work = tmp_path / "volume", tmp_path / "work"
    settings = Settings(volume=volume, work_dir=work)
    pod = settings.folders.notes_dir  # its setting, from its declaration
    assert pod == work / "families" / "notes" == settings.folders.folder("notes_dir")
    monkeypatch.setenv("TRITON_WARMUP_NOTES_DIR", str(tmp_path / "elsewhere"))
    assert Settings(volume=volume, work_dir=work).folders.notes_dir == tmp_path / "elsewhere"
    monkeypatch.delenv("TRITON_WARMUP_NOTES_DIR")

    (volume / "notes").mkdir(parents=True)
    (volume / "notes" / "a.txt").write_text("from the fleet")
    scope = warm.scope(Services(settings), None)
    restored = {m.family: m for m in warm.restore(scope)}["notes"]
    assert restored.copied == 1 and files(pod) == {"a.txt": "from the fleet"}

    (pod / "b.txt").write_text("written in the run")
    assert {m.family: m for m in warm.save(scope)}["notes"].copied == 1
    assert pod in [p for f in families.every() for p in f.watched(scope)]
    (pod / "c.txt").write_text("written under traffic")
    assert {m.family: m for m in warm.harvest(scope)}["notes"].copied == 1
    assert files(volume / "notes") == files(pod)

    host = Host(cpu_fingerprint(), Origin.of(cpu_fingerprint(), {}))
    explained = {p.family: p for p in warm.explain(scope, host, Sources())}
    assert explained["notes"].outcome == "hit" and explained["notes"].held == 3

    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(volume))
    out = tmp_path / "notes.tgz"
    argv = ["registry", "--json", "bundle", "create", str(out), "--name", "n", "--version", "1"]
    assert cli.main([*argv, "--notes", str(volume / "notes")]) == 0
    assert "notes/c.txt" in json.loads(capsys.readouterr().out)["members"]

    other = tmp_path / "other"
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(other))
    install = ["registry", "--create-store", "bundle", "install", str(out), "--fingerprint", "none"]
    assert cli.main(install) == 0
    assert files(other / "notes") == files(volume / "notes")  # its folder on that volume


def test_every_family_declares_what_the_loops_and_the_cli_need(tmp_path):
    """Properties of every family found, not a list of them."""
    found = families.every()
    assert len({f.name for f in found}) == len(found)
    settings = Settings(volume=tmp_path / "v", work_dir=tmp_path / "w")
    for family in found:
        assert family.name and family.name == family.name.lower()
        for folder in family.folders:
            assert folder.env == "TRITON_WARMUP_" + folder.name.upper()
            assert settings.folders.folder(folder.name) == tmp_path / "w" / folder.default
            assert folder.description
        if family.bundled is not None:
            assert family.option is not None, f"{family.name} is bundled but has no option"
            assert family.volume_root(settings.paths.layout) is not None
            assert family.option.flag.startswith("--")
