"""Triton's autotune results harvested one by one: checked, to the volume and shared,
a new one imported into the registry."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from registry.families import named
from registry.families.file_harvest import FileLimits, Refused
from registry.storage.store import Store
from tests.conftest import gpu_fingerprint
from tests.registry.families.conftest import make_scope

FP = gpu_fingerprint()
AUTOTUNE = named("triton-autotune")
CONFIG = {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 2, "num_ctas": 1}
RESULT = {"key": [4096, "torch.float16"], "configs_timings": [[CONFIG, [1.0, 0.9, 1.1]]]}


@pytest.fixture
def scope(tmp_path):
    return make_scope(tmp_path, fingerprint=FP, triton_env={})


def result_file(scope, text: str, name: str = "matmul.autotune.json"):
    folder = scope.folder("triton_cache_dir") / "SOMEKEY"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_it_takes_an_autotune_result_of_a_cache_folder(scope):
    cache = scope.folder("triton_cache_dir")
    assert AUTOTUNE.file_folders(scope) == [cache]
    assert AUTOTUNE.file_kind(scope, cache / "K" / "fn.autotune.json") == "autotune"
    assert AUTOTUNE.file_kind(scope, cache / "K" / "__grp__k.json") is None
    assert AUTOTUNE.file_kind(scope, cache / "fn.autotune.json") is None
    assert dict(AUTOTUNE.file_kinds) == {"autotune": "triton-autotunes"}


def test_a_result_goes_to_the_volume_into_the_registry_and_is_shared(scope):
    path = result_file(scope, json.dumps(RESULT))
    done = AUTOTUNE.harvest_file(scope, "autotune", path, FileLimits())
    assert done.result == "harvested" and done.size == len(path.read_bytes())
    assert (scope.volume.triton_cache / "SOMEKEY" / path.name).read_bytes() == path.read_bytes()
    assert [e.kernel for e in Store(scope.volume.registry).entries()] == ["matmul"]
    assert [(u.key, u.name) for u in done.uploads] == [("SOMEKEY", path.name)]
    again = AUTOTUNE.harvest_file(scope, "autotune", path, FileLimits())
    assert again.result == "deduplicated"


@pytest.mark.parametrize("text", ["[1, 2]", '{"configs_timings": 3}', "{not json"])
def test_what_is_not_an_autotune_result_is_refused(scope, text):
    path = result_file(scope, text)
    with pytest.raises(Refused, match="not an autotune result"):
        AUTOTUNE.harvest_file(scope, "autotune", path, FileLimits())
    assert not scope.volume.triton_cache.exists()


def test_a_registry_that_cannot_take_it_costs_the_import_only(tmp_path, caplog):
    def broken():
        raise OSError("read-only volume")

    scope = replace(make_scope(tmp_path, fingerprint=FP, triton_env={}), store=broken)
    path = result_file(scope, json.dumps(RESULT))
    assert AUTOTUNE.harvest_file(scope, "autotune", path, FileLimits()).result == "harvested"
    assert "not put in the registry: read-only volume" in caplog.text
