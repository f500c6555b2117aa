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
    found = families.every()
    assert found and list(found) == sorted(found, key=lambda f: (f.order, f.name))
    assert all(families.named(f.name) is f for f in found)


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
    assert len(names) == len(set(names)) and "zz_helper" not in names
    assert families.named("notes").restore(None).copied == 7  # type: ignore[arg-type]


def test_an_unknown_family_names_those_there_are():
    with pytest.raises(KeyError, match="there are tuned-configs, triton-kernels"):
        families.named("nope")


def test_the_docs_table_is_the_families_declarations():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "cache-families.md").read_text()
    table = text.split("<!-- declarations -->")[1].split("<!-- /declarations -->")[0]
    rows = [line.split("|")[1:-1] for line in table.strip().splitlines()[2:]]
    shown = [tuple(cell.strip().strip("`") for cell in row) for row in rows]
    expected = []
    for family in families.every():
        for folder in family.folders or (None,):
            expected.append(
                (
                    family.name,
                    folder.env if folder else "—",
                    folder.default if folder else "—",
                    (folder.server_env if folder else "") or "—",
                    family.option.flag if family.option else "—",
                )
            )
    assert shown == expected


def test_every_pod_folder_once_and_the_families_with_an_option(fresh):
    names = [folder.name for folder in families.pod_folders()]
    assert len(names) == len(set(names))
    declared = {folder.name for family in families.every() for folder in family.folders}
    assert set(names) == declared
    for family in families.with_option():
        assert family.bundled is not None and family.option is not None
        assert family.option.dest == family.option.flag[2:].replace("-", "_")
