import json

import pytest

from registry import Store, bundle
from warmup.cli import main


@pytest.fixture
def store(tmp_path, make_entry):
    store = Store(tmp_path / "reg")
    store.put_many([make_entry(m=m) for m in (1024, 2048)])
    return store


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_prints_a_table_and_json(capsys, store):
    code, out, _ = run(capsys, "registry", "--store", str(store.root), "ls")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["KERNEL", "SHAPE", "GPU"]
    assert "2 entries" in out and "NVIDIA-H200" in out
    code, out, _ = run(capsys, "registry", "--store", str(store.root), "--json", "ls")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 2 and rows[0]["median_ms"] == "1.0000"


def test_show_one_entry_and_refuse_ambiguity(capsys, store):
    code, out, _ = run(capsys, "registry", "--store", str(store.root), "show", "M1024")
    assert code == 0 and "out of shared memory" in out and "BLOCK_M=128" in out
    code, _, err = run(capsys, "registry", "--store", str(store.root), "show", "ag_gemm")
    assert code == 1 and "matches 2 entries" in err and len(err.strip().splitlines()) == 1


def test_bundle_create_verify_install_list_rollback(capsys, store, tmp_path, h200):
    fp_file = tmp_path / "fp.json"
    fp_file.write_text(json.dumps(h200.to_json()))
    out_file = tmp_path / "b.tgz"
    assert (
        run(
            capsys,
            "registry",
            "--store",
            str(store.root),
            "bundle",
            "create",
            str(out_file),
            "--name",
            "tp2",
            "--version",
            "3",
        )[0]
        == 0
    )
    code, out, _ = run(capsys, "registry", "bundle", "verify", str(out_file))
    assert code == 0 and "OK  tp2 3  2 entries" in out
    target = tmp_path / "target"
    code, out, _ = run(
        capsys,
        "registry",
        "--store",
        str(target),
        "--json",
        "bundle",
        "install",
        str(out_file),
        "--fingerprint",
        str(fp_file),
    )
    assert code == 0 and json.loads(out)["entries"] == 2
    code, out, _ = run(capsys, "registry", "--store", str(target), "bundle", "list")
    assert code == 0 and "tp2" in out and "install" in out
    code, out, _ = run(capsys, "registry", "--store", str(target), "rollback")
    assert code == 0 and "rolled back" in out and len(Store(target)) == 0


def test_install_with_the_wrong_fingerprint_fails_with_one_line(capsys, store, tmp_path):
    out_file = tmp_path / "b.tgz"
    bundle.create(out_file, name="tp2", version="1", entries=store.entries())
    code, _, err = run(
        capsys,
        "registry",
        "--store",
        str(tmp_path / "t"),
        "bundle",
        "install",
        str(out_file),
        "--fingerprint",
        "cpu",
    )
    assert code == 1 and err.startswith("triton-warmup: error: Bundle") and "gpu_name" in err
    assert len(err.strip().splitlines()) == 1


def test_import_and_fingerprint_commands(capsys, tmp_path):
    folder = tmp_path / "cache" / "H"
    folder.mkdir(parents=True)
    (folder / "k.autotune.json").write_text(
        json.dumps(
            {
                "key": [1],
                "configs_timings": [
                    [
                        {"kwargs": {"B": 1}, "num_warps": 4, "num_stages": 2, "num_ctas": 1},
                        [1, 1, 1],
                    ]
                ],
            }
        )
    )
    code, out, _ = run(
        capsys,
        "registry",
        "--store",
        str(tmp_path / "s"),
        "import",
        "triton-autotune",
        str(tmp_path / "cache"),
        "--fingerprint",
        "cpu",
    )
    assert code == 0 and "imported 1 entries" in out
    code, out, _ = run(capsys, "registry", "--json", "fingerprint", "--fingerprint", "cpu")
    assert code == 0 and json.loads(out)["hardware"]["gpu_name"] == "cpu"


def test_errors_exit_nonzero_with_a_reason(capsys, tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_text("nope")
    code, _, err = run(capsys, "registry", "bundle", "verify", str(bad))
    assert code == 1 and "rejected" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["registry", "bogus"])
    assert exit_info.value.code == 2
    code, _, err = run(capsys, "registry", "--store", str(tmp_path / "e"), "rollback")
    assert code == 1 and "no bundle install" in err
