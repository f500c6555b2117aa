import json

import pytest

from registry import Store
from registry.bundles import bundle
from tests.conftest import error_line
from warmup.cli import main

# The default store and Triton cache live under the volume: keep them in tmp_path.
pytestmark = pytest.mark.usefixtures("isolated")


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli(capsys, store, *args):
    """``registry --store STORE ARGS...``: exit code, stdout, stderr."""
    return run(capsys, "registry", "--store", str(store), *args)


def import_cpu(capsys, store, fmt, folder):
    """``registry --store STORE --create-store import FMT FOLDER --fingerprint cpu``."""
    return cli(capsys, store, "--create-store", "import", fmt, str(folder), "--fingerprint", "cpu")


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
    code, out, _ = import_cpu(capsys, tmp_path / "s", "triton-autotune", tmp_path / "cache")
    assert code == 0 and "imported 1 entries" in out
    code, out, _ = run(capsys, "registry", "--json", "fingerprint", "--fingerprint", "cpu")
    assert code == 0 and json.loads(out)["hardware"]["gpu_name"] == "cpu"


def test_errors_exit_nonzero_with_a_reason(capsys, tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_text("nope")
    code, _, err = run(capsys, "registry", "bundle", "verify", str(bad))
    assert code == 2 and "rejected" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["registry", "bogus"])
    assert exit_info.value.code == 2
    code, _, err = cli(capsys, tmp_path / "e", "rollback")
    assert code == 2 and "does not exist" in err
    assert not (tmp_path / "e").exists()  # a rollback of nothing creates no store
    (tmp_path / "e").mkdir()
    code, _, err = cli(capsys, tmp_path / "e", "rollback")
    assert code == 1 and "no bundle install" in err


@pytest.mark.parametrize("fmt", ["triton-autotune", "triton-dist"])
@pytest.mark.parametrize("source", ["missing", "a-file"])
def test_import_from_a_missing_folder_exits_2_and_creates_nothing(capsys, tmp_path, fmt, source):
    (tmp_path / "a-file").write_text("{}")
    code, _, err = import_cpu(capsys, tmp_path / "s", fmt, tmp_path / source)
    line = error_line(err)
    assert code == 2 and str(tmp_path / source) in line and "folder" in line
    assert not (tmp_path / "s").exists()


def test_import_of_nothing_creates_no_store(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, out, _ = import_cpu(capsys, tmp_path / "s", "triton-autotune", tmp_path / "empty")
    assert code == 0 and "*.autotune.json" in out and not (tmp_path / "s").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "k.autotune.json").write_text("not json")
    code, _, err = import_cpu(capsys, tmp_path / "s", "triton-autotune", tmp_path / "bad")
    assert code == 2 and "skipped" in err and "k.autotune.json" in err  # bad input
    assert "0 entries imported" in err and not (tmp_path / "s").exists()


def _autotune_file(folder, name, configs=1):
    """A Triton ``<name>.autotune.json`` of ``configs`` configs in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    timings = [[{"kwargs": {"B": i}, "num_warps": 4}, [1, 1, 1]] for i in range(configs)]
    path = folder / f"{name}.autotune.json"
    path.write_text(json.dumps({"key": [1], "configs_timings": timings}))
    return path


def test_an_import_skips_each_bad_file_with_its_reason_and_imports_the_others(capsys, tmp_path):
    source = tmp_path / "cache"
    _autotune_file(source / "A", "good")
    _autotune_file(source / "B", "huge", configs=8_000)  # the store would quarantine it
    nested = source / "C" / "deep.autotune.json"
    nested.parent.mkdir()
    nested.write_text("[" * 100_000 + "]" * 100_000)
    outside = _autotune_file(tmp_path / "outside", "linked")
    (source / "D").mkdir()
    (source / "D" / "linked.autotune.json").symlink_to(outside)
    (source / "E").symlink_to(outside.parent, target_is_directory=True)
    args = ["import", "triton-autotune", str(source), "--fingerprint", "cpu"]
    code, out, err = cli(capsys, tmp_path / "s", "--create-store", *args)
    assert code == 2  # bad input, after the good file imported
    assert "imported 1 entries from 1 files" in out and "skipped 4 files" in out
    lines = [line for line in err.splitlines() if line.startswith("skipped ")]
    assert len(lines) == 4
    reasons = {line.split(": ", 1)[0].removeprefix("skipped "): line for line in lines}
    assert "store's limit" in reasons[str(source / "B" / "huge.autotune.json")]
    assert "nested too deeply" in reasons[str(nested)]
    assert "link" in reasons[str(source / "D" / "linked.autotune.json")]
    assert "link to a folder" in reasons[str(source / "E")]
    assert [e.kernel for e in Store(tmp_path / "s").entries()] == ["good"]
    code, out, _ = cli(capsys, tmp_path / "s", "--json", *args)
    assert code == 2 and json.loads(out)["imported"] == 1 and len(json.loads(out)["errors"]) == 4


@pytest.mark.parametrize(
    "command",
    [["ls"], ["show", "M1024"], ["bundle", "list"], ["fingerprint", "--fingerprint", "cpu"]],
)
@pytest.mark.parametrize("where", ["before", "after"])
def test_json_works_before_and_after_the_command(capsys, store, command, where):
    flagged = ["--json", *command] if where == "before" else [*command, "--json"]
    code, out, _ = cli(capsys, store.root, *flagged)
    assert code == 0 and isinstance(json.loads(out), (list, dict))
    code, out, _ = cli(capsys, store.root, *command)
    assert code == 0 and not out.lstrip().startswith(("[", "{"))


def create(out: str, *more: str) -> list[str]:
    """``bundle create OUT --name n --version 1 MORE...``"""
    return ["bundle", "create", out, "--name", "n", "--version", "1", *more]


INSTALL = ["bundle", "install", "{bundle}", "--fingerprint", "none"]
IMPORT = ["import", "triton-dist", "{dir}", "--fingerprint", "cpu"]

BAD_INPUT = {  # test id -> (argv after "registry", what the error must name)
    "verify-missing": (["bundle", "verify", "{missing}"], "{missing}"),
    "verify-folder": (["bundle", "verify", "{dir}"], "{dir}"),
    "install-missing": (["bundle", "install", "{missing}", "--fingerprint", "none"], "{missing}"),
    "install-cache-is-file": (
        ["bundle", "install", "{bundle}", "--triton-cache", "{file}"],
        "{file}",
    ),
    "install-store-is-file": (["--store", "{file}", *INSTALL], "{file}"),
    "import-store-under-file": (["--store", "{file}/s", *IMPORT], "{file}"),
    "create-out-is-folder": (create("{dir}"), "{dir}"),
    "create-out-under-file": (create("{file}/b.tgz"), "{file}"),
    "create-unknown-kernel": (create("{out}", "--kernel", "nope"), "nope"),
    "create-empty-name": (["bundle", "create", "{out}", "--name", "", "--version", "1"], "--name"),
    "create-cache-missing": (create("{out}", "--triton-cache", "{missing}"), "{missing}"),
    "ls-store-missing": (["--store", "{missing}", "ls"], "{missing}"),
    "install-store-missing": (["--store", "{missing}", *INSTALL], "{missing}"),  # no new store
    "import-store-missing": (["--store", "{missing}", *IMPORT], "{missing}"),
    "show-store-missing": (["--store", "{missing}", "show", "M1"], "{missing}"),
    "list-store-missing": (["--store", "{missing}", "bundle", "list"], "{missing}"),
    "create-store-missing": (["--store", "{missing}", *create("{out}")], "{missing}"),
    "ls-store-is-file": (["--store", "{file}", "ls"], "{file}"),
    "ls-unknown-kernel": (["ls", "--kernel", "nope"], "nope"),
    "show-no-match": (["show", "M999"], "M999"),
    "fingerprint-none": (["fingerprint", "--fingerprint", "none"], "none"),
    "import-fingerprint-none": (
        ["import", "triton-dist", "{dir}", "--fingerprint", "none"],
        "none",
    ),
    "fingerprint-file-missing": (["fingerprint", "--fingerprint", "{missing}"], "{missing}"),
    "fingerprint-file-not-one": (["fingerprint", "--fingerprint", "{file}"], "{file}"),
}


@pytest.mark.parametrize(("argv", "named"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_exits_2_with_one_line_naming_it(capsys, store, tmp_path, argv, named):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("[1]")
    bundle.create(tmp_path / "b.tgz", name="b", version="1", entries=store.entries())
    paths = {
        "missing": tmp_path / "missing",
        "dir": tmp_path / "dir",
        "file": tmp_path / "file",
        "bundle": tmp_path / "b.tgz",
        "out": tmp_path / "out.tgz",
    }
    before = sorted(tmp_path.rglob("*"))
    argv = [a.format(**paths) for a in argv]
    if "--store" not in argv:
        argv = ["--store", str(store.root), *argv]
    code, _, err = run(capsys, "registry", *argv)
    line = error_line(err)
    assert code == 2 and named.format(**paths) in line
    assert sorted(tmp_path.rglob("*")) == before  # bad input writes nothing


def test_a_store_that_is_not_there_is_an_error_unless_asked_to_create_it(capsys, tmp_path):
    missing = tmp_path / "no" / "registry"
    code, out, err = cli(capsys, missing, "ls")
    line = error_line(err)
    assert code == 2 and out == "" and f"--store '{missing}' does not exist" in line
    assert "--create-store" in line and not (tmp_path / "no").exists()
    code, out, _ = run(capsys, "registry", "--create-store", "--store", str(missing), "ls")
    assert code == 0 and f"0 entries in {missing}" in out and missing.is_dir()


def test_the_default_store_of_a_volume_with_nothing_stored_yet_is_empty(capsys, isolated):
    code, _, err = run(capsys, "registry", "ls")  # TRITON_WARMUP_VOLUME: not there
    assert code == 2 and "the default store" in error_line(err) and "TRITON_WARMUP_VOLUME" in err
    (isolated / "volume").mkdir()  # a volume mounted, nothing stored on it yet
    code, out, _ = run(capsys, "registry", "ls")
    assert code == 0 and f"0 entries in {isolated / 'volume' / 'registry'}" in out
