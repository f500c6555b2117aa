"""The families are found by their modules: a new one is its own file, in its order."""

from __future__ import annotations

import sys

import pytest

from registry import families


@pytest.fixture
def fresh():
    families.every.cache_clear()
    yield
    families.every.cache_clear()
    for name in [m for m in sys.modules if m.startswith("registry.families.zz_")]:
        del sys.modules[name]


def test_the_families_in_their_order(fresh):
    assert [f.name for f in families.every()] == [
        "tuned-configs",
        "triton-kernels",
        "triton-autotune",
        "inductor",
        "declared-folders",
    ]
    assert families.named("inductor").order < families.named("declared-folders").order


def test_a_module_that_defines_a_family_is_one_without_any_other_change(
    fresh, tmp_path, monkeypatch
):
    (tmp_path / "zz_notes.py").write_text(
        "from registry.families.base import Family, Moved\n"
        "class Notes(Family):\n"
        "    name, order = 'notes', 35\n"
        "    def restore(self, scope):\n"
        "        return Moved(self.name, copied=7)\n"
        "FAMILY = Notes()\n"
    )
    (tmp_path / "zz_helper.py").write_text("VALUE = 1  # no FAMILY: not a family\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    names = [f.name for f in families.every()]
    assert names.index("notes") == names.index("triton-autotune") + 1
    assert len(names) == 6
    assert families.named("notes").restore(None).copied == 7  # type: ignore[arg-type]


def test_an_unknown_family_names_those_there_are():
    with pytest.raises(KeyError, match="there are tuned-configs, triton-kernels"):
        families.named("nope")
