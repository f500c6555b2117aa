"""A declared model's key: read from its module's source, never by running it."""

import sys

import pytest

from warmup.compiled.key import function_source, model_key, module_source
from warmup.core.manifest import ModelEntry


def model(build: str, **changes: object) -> ModelEntry:
    inputs = [{"shape": ["b", 8], "dtype": "fp32"}]
    return ModelEntry.model_validate(
        {"name": "m", "build": build, "dims": {"b": [1, 2]}, "inputs": inputs, **changes}
    )


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package whose ``__init__`` refuses to run, and a model module inside it."""
    (tmp_path / "keyed_pkg").mkdir()
    (tmp_path / "keyed_pkg" / "__init__.py").write_text("raise RuntimeError('never run')\n")
    (tmp_path / "keyed_pkg" / "net.py").write_text("def build(device):\n    return device\n")
    monkeypatch.chdir(tmp_path)  # found as the ranks find it: the working folder first
    yield tmp_path / "keyed_pkg"
    for name in ("keyed_pkg", "keyed_pkg.net"):
        sys.modules.pop(name, None)


def test_the_source_is_found_without_running_the_package(package):
    assert module_source("keyed_pkg.net").startswith("def build(device):")
    assert "keyed_pkg" not in sys.modules


def test_a_missing_module_is_a_value_error(package):
    with pytest.raises(ValueError, match="cannot import nowhere_at_all"):
        module_source("nowhere_at_all.net")


def test_the_key_changes_with_the_function_and_the_declaration_not_with_the_path(package):
    key = model_key(model("keyed_pkg.net:build"))
    assert key.digest == model_key(model("keyed_pkg.net:build")).digest
    assert key.digest != model_key(model("keyed_pkg.net:build", world_size=2)).digest
    (package / "net.py").write_text("def build(device):\n    return None\n")
    assert key.digest != model_key(model("keyed_pkg.net:build")).digest
    assert str(package) not in str(key.parts)


def test_only_a_top_level_def_is_hashed_by_its_tree():
    source = "x = 1\n\n\ndef build(device):\n    return x\n"
    moved = "\n\n" + source
    assert function_source(source, "build", "m:build") == function_source(moved, "build", "m:build")
    assert function_source(source, "x", "m:x") == "not a top-level def: x"
    with pytest.raises(ValueError, match="does not parse"):
        function_source("def (", "build", "m:build")
