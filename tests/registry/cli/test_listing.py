"""``registry ls`` and ``registry show`` (``registry.cli.listing``): the store's entries as
tables or JSON, and the compiled models stored beside them (the Inductor family,
``registry.caches.inductor_cache``): which model, key and fingerprint, the declared dims, how big
and how old; and one entry or index in detail."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from registry import Entry, KernelConfig, Measurement, Store
from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from registry.core.volume import Volume
from tests.conftest import error_line
from tests.registry.caches.test_inductor_cache import cache
from tests.registry.cli.test_main import cli, run

pytestmark = pytest.mark.usefixtures("isolated")

FP = cpu_fingerprint()
OTHER = cpu_fingerprint("another kernel hash")  # another fingerprint, as another host's
MLP_KEY, BLOCKS_KEY = "0123456789abcdef", "fedcba9876543210"
FILES = {  # 5 + 8 + 4 + 4 bytes in 4 files; code.py and again.py share one blob
    "fxgraph/ab/entry": b"graph",
    "aotautograd/aq/entry": b"autograd",
    "ab/code.py": b"code",
    "cd/again.py": b"code",
}


@pytest.fixture
def volume(tmp_path, make_entry):
    """A volume holding one tuned entry and three indexes: mlp for two fingerprints,
    blocks (with its declared dims) for one."""
    paths = Volume(tmp_path / "vol")
    Store(paths.registry, create=True).put(make_entry(m=1024))
    source = cache(tmp_path / "inductor-cache", FILES)
    for model, key, fp, dims in (
        ("mlp", MLP_KEY, FP, None),
        ("mlp", MLP_KEY, OTHER, None),
        ("blocks", BLOCKS_KEY, FP, {"batch": [1, 4, 16], "seq": 128}),
    ):
        parts = {"build": f"server:{model}", **({"dims": dims} if dims else {})}
        inductor_cache.save(
            source, paths.inductor, model=model, key_digest=key, key=parts, fingerprint=fp
        )
    return paths


def registry(capsys, paths, *argv):
    return run(capsys, "registry", "--store", str(paths.registry), *argv)


# ---- entries ----------------------------------------------------------------------------


def test_ls_prints_a_table_and_json(capsys, store):
    code, out, _ = cli(capsys, store.root, "ls")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["KERNEL", "SHAPE", "GPU"]
    assert "2 entries" in out and "NVIDIA-H200" in out
    code, out, _ = cli(capsys, store.root, "--json", "ls")
    rows = json.loads(out)["entries"]
    assert code == 0 and len(rows) == 2 and rows[0]["median_ms"] == 1.0


def test_show_one_entry_and_refuse_ambiguity(capsys, store):
    code, out, _ = cli(capsys, store.root, "show", "M1024")
    assert code == 0 and "out of shared memory" in out and "BLOCK_M=128" in out
    code, _, err = cli(capsys, store.root, "show", "ag_gemm")
    assert code == 2 and "matches 2 entries" in err and len(err.strip().splitlines()) == 1


def test_times_are_numbers_in_json_and_text_in_tables(capsys, tmp_path):
    failed = KernelConfig.make({"BLOCK_M": 16})
    store = Store(tmp_path / "reg", create=True)
    store.put(
        Entry.make(
            "k",
            {"M": 1},
            cpu_fingerprint(),
            failed,
            measurements=(Measurement(failed, error="out of shared memory"),),
        )
    )
    code, out, _ = cli(capsys, store.root, "ls", "--json")
    assert code == 0 and json.loads(out)["entries"][0]["median_ms"] is None
    code, out, _ = cli(capsys, store.root, "ls")
    assert code == 0 and "None" not in out and " - " in out


def test_ls_json_median_is_a_float(capsys, store):
    code, out, _ = cli(capsys, store.root, "ls", "--json")
    medians = [row["median_ms"] for row in json.loads(out)["entries"]]
    assert code == 0 and medians == [1.0, 1.0]
    code, out, _ = cli(capsys, store.root, "show", "M1024", "--json")
    timings = json.loads(out)["measurements"][0]
    assert isinstance(timings["median_ms"], float) and isinstance(timings["p20_ms"], float)


# ---- compiled models ----------------------------------------------------------------------


def test_ls_lists_each_stored_model_beside_the_entries(capsys, volume):
    code, out, _ = registry(capsys, volume, "ls")
    assert code == 0
    lines = out.splitlines()
    assert "1 entries in" in out and f"3 compiled models in {volume.inductor}" in lines[-1]
    header = next(i for i, line in enumerate(lines) if line.startswith("MODEL"))
    assert lines[header].split() == [
        "MODEL", "KEY", "FINGERPRINT", "GPU", "SHAPES", "FILES", "SIZE", "AGE",
    ]  # fmt: skip
    rows = [line.split() for line in lines[header + 1 : -1]]
    assert rows[0][:9] == ["blocks", BLOCKS_KEY[:12], FP.digest()[:10], "cpu",
                           "batch=[1,4,16]", "seq=128", "4", "17", "B"]  # fmt: skip
    assert rows[0][9].endswith("s")  # seconds old: written by the fixture just now
    assert sorted(r[2] for r in rows[1:]) == sorted([FP.digest()[:10], OTHER.digest()[:10]])
    assert all(r[:2] == ["mlp", MLP_KEY[:12]] and r[4] == "-" for r in rows[1:])


def test_ls_json_gives_every_models_key_fingerprint_size_and_age(capsys, volume):
    code, out, _ = registry(capsys, volume, "ls", "--json")
    listed = json.loads(out)
    assert code == 0 and [e["kernel"] for e in listed["entries"]] == ["ag_gemm"]
    blocks = listed["models"][0]
    assert blocks["model"] == "blocks" and blocks["key"] == BLOCKS_KEY
    assert blocks["fingerprint"] == FP.digest()[:10]
    assert blocks["shapes"] == {"batch": [1, 4, 16], "seq": 128}
    assert blocks["files"] == 4 and blocks["bytes"] == 17  # the shared blob counted once
    assert 0 <= blocks["age_s"] < 60
    assert blocks["path"] == inductor_cache.index_relpath("blocks", BLOCKS_KEY, FP)
    assert [m["model"] for m in listed["models"]] == ["blocks", "mlp", "mlp"]
    assert listed["unreadable_models"] == []


def test_an_age_is_counted_from_the_index_written(capsys, volume):
    path = inductor_cache.index_path(volume.inductor, "blocks", BLOCKS_KEY, FP)
    index = json.loads(path.read_text())
    index["created"] = (datetime.now(timezone.utc) - timedelta(days=2)).isoformat()
    path.write_text(json.dumps(index))
    code, out, _ = registry(capsys, volume, "ls", "--model", "blocks", "--json")
    [blocks] = json.loads(out)["models"]
    assert code == 0 and abs(blocks["age_s"] - 2 * 86400) < 60
    code, out, _ = registry(capsys, volume, "ls", "--model", "blocks")
    assert out.splitlines()[1].split()[-1] == "2.0d"


def test_model_and_kernel_each_keep_to_their_own_section(capsys, volume):
    code, out, _ = registry(capsys, volume, "ls", "--model", "mlp")
    assert code == 0 and "KERNEL" not in out and "entries in" not in out
    assert "2 compiled models in" in out and "blocks" not in out
    code, out, _ = registry(capsys, volume, "ls", "--kernel", "ag_gemm")
    assert code == 0 and "1 entries in" in out and "compiled models" not in out
    code, _, err = registry(capsys, volume, "ls", "--model", "nope")
    line = error_line(err)
    assert code == 2 and "--model 'nope'" in line and "models there: blocks, mlp" in line


def test_a_store_outside_a_volume_lists_models_only_when_told_where(capsys, volume, tmp_path):
    store = tmp_path / "lone-store"
    store.mkdir()
    code, out, _ = run(capsys, "registry", "--store", str(store), "ls")
    assert code == 0 and "compiled models: not read" in out and "--volume" in out
    argv = ["registry", "--store", str(store), "ls", "--inductor", str(volume.inductor)]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and f"3 compiled models in {volume.inductor}" in out
    code, _, err = run(capsys, *argv[:-1], str(tmp_path / "missing"))
    assert code == 2 and "--inductor" in error_line(err)


def test_the_default_store_lists_its_volumes_models(capsys, volume, monkeypatch):
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(volume.root))
    code, out, _ = run(capsys, "registry", "ls")
    assert code == 0 and f"3 compiled models in {volume.inductor}" in out


def test_an_unreadable_index_is_listed_as_such_and_the_others_still(capsys, volume):
    bad = volume.inductor / "models" / "mlp" / "cpu" / "sw" / "00000000deadbeef.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    misplaced = volume.inductor / "models" / "mlp" / "cpu" / "sw" / "0123456789abcdef.json"
    misplaced.write_bytes(inductor_cache.index_path(
        volume.inductor, "mlp", MLP_KEY, FP).read_bytes())  # fmt: skip
    code, out, _ = registry(capsys, volume, "ls", "--json")
    listed = json.loads(out)
    assert code == 0 and len(listed["models"]) == 3
    errors = {u["path"]: u["error"] for u in listed["unreadable_models"]}
    assert set(errors) == {"models/mlp/cpu/sw/00000000deadbeef.json",
                           "models/mlp/cpu/sw/0123456789abcdef.json"}  # fmt: skip
    assert "belongs at models/mlp/cpu/" in errors["models/mlp/cpu/sw/0123456789abcdef.json"]
    code, out, _ = registry(capsys, volume, "ls")
    assert code == 0 and "3 compiled models in" in out and "2 unreadable indexes" in out


def test_show_gives_one_models_index_in_detail(capsys, volume):
    code, out, _ = registry(capsys, volume, "show", "models/blocks/")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == inductor_cache.index_relpath("blocks", BLOCKS_KEY, FP)
    assert f"key {BLOCKS_KEY}" in lines[1] and f"fingerprint {FP.digest()[:10]}" in lines[1]
    assert "4 files in 3 blobs (17 B stored)" in out and "missing" not in out
    assert 'key dims: {"batch": [1, 4, 16], "seq": 128}' in out
    assert "??/ (generated code)  2      8 B" in out and "fxgraph/" in out
    code, out, _ = registry(capsys, volume, "show", "models/blocks/", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["key"]["build"] == "server:blocks" and shown["blobs"] == 3
    assert shown["folders"]["fxgraph/"] == {"files": 1, "bytes": 5}
    assert shown["fingerprint"] == FP.to_json() and shown["missing_blobs"] == []


def test_show_names_the_blobs_a_family_lacks(capsys, volume):
    index = inductor_cache.read_index(
        inductor_cache.index_path(volume.inductor, "blocks", BLOCKS_KEY, FP)
    )
    sha = index["files"]["fxgraph/ab/entry"][0]
    inductor_cache.blob_path(volume.inductor, sha).unlink()
    code, out, _ = registry(capsys, volume, "show", "models/blocks/", "--json")
    assert code == 0 and json.loads(out)["missing_blobs"] == [sha]
    code, out, _ = registry(capsys, volume, "show", "models/blocks/")
    assert "1 blobs missing from" in out


def test_show_refuses_a_selector_that_matches_an_entry_and_a_model(capsys, volume):
    code, _, err = registry(capsys, volume, "show", ".json")  # every entry and index
    line = error_line(err)
    assert code == 2 and "matches 4 entries or compiled models (need 1)" in line
    code, _, err = registry(capsys, volume, "show", "models/mlp/")
    assert code == 2 and "matches 2" in error_line(err)


def test_ages_and_sizes_read_as_a_person_says_them():
    from registry.cli.listing import _age, _size

    assert [_size(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**30)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3.0 GiB",
    ]  # fmt: skip
    assert [_age(s) for s in (0, 59, 600, 5400, 3 * 86400)] == ["0s", "59s", "10m", "1.5h", "3.0d"]
