"""The references the docs hook makes from the code (settings, command line, metrics)
hold everything the code defines, and every name the pages use is one the code has."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.blocks import COMMANDS, ROOT, all_blocks, pages
from warmup.cli import build_parser
from warmup.core.settings import Settings


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "docs/hooks/reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = load_hook()


@pytest.fixture(scope="module")
def metrics_page() -> str:
    return hook.render("metrics")


def documented_metrics(page: str) -> set[str]:
    """The metric families a rendered metrics reference lists (counters without _total)."""
    names = re.findall(r"^\| `(triton_warmup_\w+)` \| (\w+) \|", page, re.M)
    return {name.removesuffix("_total") if kind == "counter" else name for name, kind in names}


def test_the_settings_reference_lists_every_field_with_its_variable():
    page = hook.render("settings")
    for variable, attribute, field in Settings.fields():
        row = next(line for line in page.splitlines() if f"`{variable}`" in line)
        assert hook.cell(field.description) in row and f"`settings.{attribute}`" in row
    for group in Settings.model_fields:
        assert f"### {group}\n" in page
    assert "| `TRITON_WARMUP_WORLD_SIZE` | integer, ≥ 1, ≤ 8 | unset |" in page
    assert "| `TRITON_WARMUP_DEVICE` | auto or cpu or cuda | `auto` |" in page


def test_the_cli_reference_has_a_section_for_every_command_and_option():
    page = hook.render("cli")
    parser = build_parser(Settings())
    for words, command, _ in hook.commands(parser, ["triton-warmup"], ""):
        assert f"# {' '.join(words)}\n" in page
        for action in command._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert f"`{', '.join(action.option_strings)}`" in page
    assert "#### triton-warmup registry bundle install" in page


def test_the_metrics_reference_lists_every_metric_the_code_names(metrics_page):
    sources = [*(ROOT / "warmup").rglob("*.py"), *(ROOT / "registry").rglob("*.py")]
    named = {
        re.sub(r"_(total|count|sum|bucket|created)$", "", name)
        for path in sources
        for name in re.findall(r"[\"'](triton_warmup_\w+)[\"']", path.read_text())
    }
    missing = named - documented_metrics(metrics_page)
    assert not missing, f"add their module to METRICS_MODULES in docs/hooks/reference.py: {missing}"
    row = "| `triton_warmup_serving_calls_total` | counter | kernel, source, rank |"
    assert row in metrics_page


def test_a_placeholder_is_replaced_and_an_unknown_one_fails_the_build():
    page = "# Settings\n\n<!-- reference: settings -->\n\nafter\n"
    out = hook.on_page_markdown(page, page=None, config=None, files=None)
    assert "`TRITON_WARMUP_VOLUME`" in out and out.endswith("after\n")
    with pytest.raises(ValueError, match="'setings' is unknown"):
        hook.on_page_markdown("<!-- reference: setings -->\n")


def test_every_variable_the_pages_name_is_a_setting():
    known = {variable for variable, _, _ in Settings.fields()}
    for path in pages():
        named = set(re.findall(r"\bTRITON_WARMUP_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
        assert named <= known, f"{path.name} names unknown settings: {named - known}"


def test_every_metric_the_pages_name_is_registered(metrics_page):
    known = documented_metrics(metrics_page)
    for path in pages():
        named = re.findall(r"\btriton_warmup_\w*[a-z0-9]", path.read_text())
        unknown = {name for name in named if name.removesuffix("_total") not in known}
        assert not unknown, f"{path.name} names unknown metrics: {unknown}"


def test_every_command_the_pages_show_exists():
    parser = build_parser(Settings())
    known = {" ".join(words[1:3]) for words, _, _ in hook.commands(parser, ["triton-warmup"], "")}
    code = [b.text for b in all_blocks() if b.lang in COMMANDS] + [
        span for path in pages() for span in re.findall(r"`([^`\n]+)`", path.read_text())
    ]
    for text in code:
        for found in re.findall(r"\btriton-warmup((?: [a-z][a-z-]*){1,2})", text):
            words = found.split()
            group = words[0] == "registry" and len(words) == 2  # a registry command
            assert " ".join(words[: 2 if group else 1]) in known, f"no command {found!r}"


def test_every_page_is_in_the_nav():
    import yaml

    def files(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        items = nav.values() if isinstance(nav, dict) else nav
        return [f for item in items for f in files(item)]  # type: ignore[union-attr]

    nav = files(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in Path(ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == on_disk


def named_paths(text: str) -> set[str]:
    """Files of the repository a page names (``warmup/run/launch.py``, ``bench/fleet.py``)."""
    top = "warmup|registry|kernels|bench|tests|deploy|examples|docs"
    found = re.finditer(rf"(?<![\w/<.-])((?:{top})/[\w./-]*\w)(?![\w./{{*<-])", text)
    return {match.group(1) for match in found}  # a pattern (run{1,2}.json) is not a file


def named_modules(text: str) -> set[str]:
    """Dotted names a page gives (``warmup.serving``, ``registry.lock``, ``kernels.ADAPTERS``);
    not the chart's camelCase values (``warmup.otherWorldSizes``)."""
    found = re.findall(r"(?<![\w/.-])((?:warmup|registry|kernels)(?:\.\w+)+)(?![\w/-])", text)
    return {name for name in found if not re.search(r"\.[a-z]+[A-Z]", name)}


def resolves(dotted: str) -> bool:
    """A module, or a name its module's source defines or imports; found importing no more
    than the packages above it."""
    parts = dotted.split(".")
    spec, cut = None, 0
    while cut < len(parts):
        found = importlib.util.find_spec(".".join(parts[: cut + 1]))
        if found is None:
            break
        spec, cut = found, cut + 1
        if found.submodule_search_locations is None:  # a module: no submodules below it
            break
    rest = parts[cut:]
    if not rest:
        return True
    if len(rest) > 1 or spec is None or spec.origin is None:
        return False
    name = re.escape(rest[0])
    defined = (
        rf"^\s*(?:(?:async\s+)?def|class)\s+{name}\b"  # def, class
        rf"|^{name}\s*[:=]"  # a module-level name
        rf"|\bimport\b[^\n]*\b{name}\b|^\s+{name},?$"  # imported, one line or in ( )
    )
    return re.search(defined, Path(spec.origin).read_text(), re.M) is not None


def test_every_file_and_module_the_pages_name_exists():
    for path in pages():
        text = path.read_text()
        gone = {p for p in named_paths(text) if not (ROOT / p.split("::")[0]).exists()}
        assert not gone, f"{path.name} names files that are not there: {sorted(gone)}"
        for test_file, name in re.findall(r"(tests/[\w/]+\.py)::(\w+)", text):
            source = (ROOT / test_file).read_text()
            assert f"def {name}(" in source, f"{path.name} names no test: {test_file}::{name}"
        text = re.sub(r"\]\([^)]*\)", "]", text)  # a link's target is a page, not a module
        unknown = {m for m in named_modules(text) if not resolves(m)}
        assert not unknown, f"{path.name} names modules that are not there: {sorted(unknown)}"
