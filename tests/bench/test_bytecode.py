"""The benches run the program as the image has it: every imported module compiled."""

import importlib.util
import os
from pathlib import Path

from bench.bytecode import compile_imports


def _package(root: Path) -> list[Path]:
    (root / "pkg_probe").mkdir()
    init = root / "pkg_probe" / "__init__.py"
    init.write_text("")
    module = root / "pkg_probe" / "mod.py"
    module.write_text("import json\nVALUE = json.dumps(1)\n")
    return [init, module]


def test_every_imported_module_gets_its_bytecode_once(tmp_path):
    sources = _package(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    assert sorted(compile_imports(["pkg_probe.mod"], env)) == [str(s) for s in sources]
    for source in sources:
        assert Path(importlib.util.cache_from_source(str(source))).is_file()
    assert compile_imports(["pkg_probe.mod"], env) == []  # all fresh: nothing to write
    stat = sources[1].stat()
    os.utime(sources[1], (stat.st_atime, stat.st_mtime + 10))  # edited since
    assert compile_imports(["pkg_probe.mod"], env) == [str(sources[1])]


def test_a_folder_that_cannot_be_written_is_left_as_it_is(tmp_path):
    sources = _package(tmp_path)
    (tmp_path / "pkg_probe" / "__pycache__").write_text("a file where the folder goes")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    assert compile_imports(["pkg_probe.mod"], env) == []
    assert all(s.is_file() for s in sources)
