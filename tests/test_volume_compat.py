"""A volume written before the rooms and floors of [5.1] reads after them: the data file is
the volume `triton-warmup run --manifest examples/demo.yaml --device cpu` wrote at
795963d (three tuned ag_gemm shapes, the demo model's Inductor artifacts, the host's
record). Its layout is the product's promise to every volume in a fleet."""

import json
import tarfile
from pathlib import Path

import pytest

from registry import Store, families
from registry.core.fingerprint import Fingerprint
from registry.families import Declared
from warmup.caches import families as warm
from warmup.cli import main
from warmup.core.services import Services
from warmup.core.settings import Settings

OLD = Path(__file__).parent / "data" / "volume-795963d.tgz"


@pytest.fixture
def volume(tmp_path) -> Path:
    with tarfile.open(OLD) as tar:
        tar.extractall(tmp_path, filter="tar")
    return tmp_path / "volume"


def test_the_old_store_answers_with_its_entries(volume):
    store = Store(volume / "registry")
    entries = store.entries()
    assert len(entries) == 3 and {e.kernel for e in entries} == {"ag_gemm"}
    found = store.lookup(entries[0].kernel, entries[0].key, entries[0].fingerprint)
    assert found is not None and found.best == entries[0].best


def test_registry_ls_lists_the_old_entries_and_model(volume, capsys):
    assert main(["registry", "--store", str(volume / "registry"), "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed["entries"]) == 3
    assert [m["model"] for m in listed["models"]] == ["demo-mlp"]


def test_the_old_models_artifacts_restore_into_a_pod(volume, tmp_path):
    [record] = (volume / "hosts").glob("*.json")
    fingerprint = Fingerprint.from_json(json.loads(record.read_text())["fingerprint"])
    [index] = (volume / "inductor" / "models").rglob("*.json")
    settings = Settings(volume=volume, work_dir=tmp_path / "work")
    scope = warm.scope(Services(settings), None, fingerprint=fingerprint)
    done = families.models().restore_one(scope, Declared("demo-mlp", index.stem))
    assert done.outcome == "hit" and done.copied > 0
    pod = settings.folders.inductor_cache_dir
    assert sum(1 for p in pod.rglob("*") if p.is_file()) >= done.copied
