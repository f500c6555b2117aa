"""The benches run the program as the image has it: every imported module compiled."""

import importlib.util
import os
from pathlib import Path

import pytest

from bench.bytecode import compile_imports


def _package(root: Path) -> list[Path]:
    (root / "pkg_probe").mkdir()
    init = root / "pkg_probe" / "__init__.py"
    init.write_text("")
    module = root / "pkg_probe" / "mod.py"
    module.write_text("import json\nVALUE = json.dumps(1)\n")
    return [init, module]


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


def test_every_imported_module_gets_its_bytecode_once(tmp_path):
    sources = _package(tmp_path)
    env, roots = _env(tmp_path), [tmp_path]
    assert sorted(compile_imports(["pkg_probe.mod"], env, roots)) == [str(s) for s in sources]
    for source in sources:
        assert Path(importlib.util.cache_from_source(str(source))).is_file()
    assert compile_imports(["pkg_probe.mod"], env, roots) == []  # all fresh
    stat = sources[1].stat()
    os.utime(sources[1], (stat.st_atime, stat.st_mtime + 10))  # edited since
    assert compile_imports(["pkg_probe.mod"], env, roots) == [str(sources[1])]


def test_a_source_edited_under_an_old_mtime_is_compiled_again(tmp_path):
    # a checkout or `rsync -t` can leave an edited file with an mtime older than its pyc;
    # Python compares the mtime and size its pyc recorded, and so does the bench
    sources = _package(tmp_path)
    env, roots = _env(tmp_path), [tmp_path]
    compile_imports(["pkg_probe.mod"], env, roots)
    stat = sources[1].stat()
    sources[1].write_text("import json\nVALUE = json.dumps(2)  # edited\n")
    os.utime(sources[1], (stat.st_atime, stat.st_mtime - 100))
    assert compile_imports(["pkg_probe.mod"], env, roots) == [str(sources[1])]


def test_a_folder_that_cannot_be_written_is_left_as_it_is(tmp_path):
    sources = _package(tmp_path)
    (tmp_path / "pkg_probe" / "__pycache__").write_text("a file where the folder goes")
    assert compile_imports(["pkg_probe.mod"], _env(tmp_path), [tmp_path]) == []
    assert all(s.is_file() for s in sources)


def test_a_module_that_fails_to_import_says_why(tmp_path):
    (tmp_path / "pkg_broken.py").write_text("raise ImportError('a missing wheel')\n")
    with pytest.raises(RuntimeError, match="a missing wheel"):
        compile_imports(["pkg_broken"], _env(tmp_path), [tmp_path])
