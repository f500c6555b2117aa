"""Finding a user's ``module:function`` without running it, and importing it."""

import os
import re
import sys

import pytest

from warmup.core.module_finder import (
    find_function,
    find_spec,
    import_callable,
    working_folder_importable,
)

WARM_KEYWORDS = ("shape", "dtype", "device")  # as the run calls a warm function

MODULE = """
import functools
from elsewhere import imported
from typing import *

def warm(*, shape, dtype, device=None):
    pass

def two(a, /, b, *rest, c=1 + 2, **more):
    pass

@functools.cache
def decorated(x):
    pass

assigned = warm
if True:
    def conditional(x):
        pass
"""


@pytest.mark.parametrize(
    "name,problem",
    [
        ("warm", None),
        ("two", "which its signature two(a, /, b, *rest, c=1 + 2, **more) refuses: missing a"),
        ("decorated", None),  # a decorator may change the signature: the run checks it
        ("imported", None),
        ("assigned", None),
        ("conditional", None),
        ("nowhere", None),  # the star import may bind it
    ],
)
def test_a_function_is_found_and_its_signature_read_without_running_its_module(
    tmp_path, monkeypatch, name, problem
):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('never run')\n")
    (tmp_path / "pkg" / "mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    if problem is None:
        find_function(f"pkg.mod:{name}", WARM_KEYWORDS)
    else:
        with pytest.raises(ValueError, match=re.escape(problem)):
            find_function(f"pkg.mod:{name}", WARM_KEYWORDS)
    assert "pkg" not in sys.modules and "pkg.mod" not in sys.modules


@pytest.mark.parametrize(
    "source,problem",
    [
        ("def warm(: pass\n", "cannot import plain: SyntaxError: "),
        ("def warm(shape, dtype): pass\n", "got an unexpected keyword argument 'device'"),
    ],
)
def test_a_function_that_is_not_there_or_not_callable_so_is_refused(
    tmp_path, monkeypatch, source, problem
):
    (tmp_path / "plain.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(problem)):
        find_function("plain:warm", WARM_KEYWORDS)
    assert "plain" not in sys.modules


@pytest.mark.parametrize(
    "files,spec",
    [
        # a pkgutil-style namespace package: its __init__ extends __path__ at import
        (
            {
                "ns/__init__.py": (
                    "from pkgutil import extend_path\n__path__ = extend_path(__path__, 'ns')\n"
                ),
                "other/ns/sub.py": "def warm(*, shape, dtype, device): pass\n",
            },
            "ns.sub:warm",
        ),
        ({"late.py": "import sys\nsetattr(sys.modules[__name__], 'warm', print)\n"}, "late:warm"),
        ({"late.py": "def _bind():\n    global warm\n    warm = print\n_bind()\n"}, "late:warm"),
    ],
)
def test_a_function_only_its_import_can_find_passes_with_a_note(tmp_path, monkeypatch, files, spec):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    monkeypatch.syspath_prepend(str(tmp_path))
    note = find_function(spec, WARM_KEYWORDS)
    assert note is not None
    assert not {"ns", "late"} & set(sys.modules)


@pytest.mark.parametrize(
    ("files", "spec", "error"),
    [
        # a typo'd function in a module that binds nothing at run time
        ({"late.py": "def other(*, shape, dtype, device): pass\n"}, "late:warm", "no attribute"),
        # a typo'd submodule of a plain package: its __init__ cannot add one
        ({"pkg/__init__.py": "", "pkg/real.py": ""}, "pkg.typo:warm", "No module named"),
    ],
)
def test_a_typo_in_a_module_or_function_name_is_refused_without_importing(
    tmp_path, monkeypatch, files, spec, error
):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=error):
        find_function(spec, WARM_KEYWORDS)
    assert not {"pkg", "late"} & set(sys.modules)


def test_a_top_level_package_that_is_not_there_is_still_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="No module named 'nowhere_at_all'"):
        find_function("nowhere_at_all.sub:warm", WARM_KEYWORDS)


def test_an_imported_function_is_checked_against_the_call_it_will_get(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(
        "def warm(*, shape, dtype, device): pass\ndef narrow(shape): pass\nvalue = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    assert import_callable("mine:warm", WARM_KEYWORDS).__name__ == "warm"
    with pytest.raises(ValueError, match=re.escape("'mine:narrow': a warmup calls it as narrow(")):
        import_callable("mine:narrow", WARM_KEYWORDS)
    with pytest.raises(ValueError, match="'mine:value': module mine has no function 'value'"):
        import_callable("mine:value", WARM_KEYWORDS)
    with pytest.raises(ValueError, match="cannot import nowhere_at_all: ModuleNotFoundError"):
        import_callable("nowhere_at_all:warm", WARM_KEYWORDS)


def test_a_spec_is_found_without_running_its_package(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('never run')\n")
    (tmp_path / "pkg" / "mod.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = find_spec("pkg.mod")
    assert not isinstance(spec, str) and spec.origin == str(tmp_path / "pkg" / "mod.py")
    assert "pkg" not in sys.modules


def test_the_working_folder_is_importable_only_inside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    with working_folder_importable():
        assert sys.path[0] == str(tmp_path)
    assert str(tmp_path) not in sys.path
