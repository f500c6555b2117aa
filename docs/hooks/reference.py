"""MkDocs hook: the settings, command-line and metrics references, made from the code at
every build so that they cannot drift from it.

A page asks for one with a comment on a line of its own, ``<!-- reference: settings -->``
(or ``cli``, ``metrics``); the build fails on a name it does not know. Only public names
are read: ``Settings``, its groups and their fields, ``warmup.cli.build_parser`` and the
metrics classes on a fresh ``CollectorRegistry``.
"""

from __future__ import annotations

import argparse
import enum
import html
import importlib
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PLACEHOLDER = re.compile(r"^<!-- reference: (\S+) -->$", re.M)
# Modules whose ``*Metrics`` classes (those taking ``registry=``) make the metrics page,
# with who writes them. tests/docs checks that every metric name in the code is listed.
METRICS_MODULES = {
    "warmup.core.metrics": "the run (`triton-warmup run`) and the sidecar",
    "warmup.serving": "a serving process, re-exported by the sidecar",
}
USAGE_WIDTH = 88


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each placeholder of a page by its reference."""
    return PLACEHOLDER.sub(lambda match: render(match.group(1)), markdown)


def render(name: str) -> str:
    """The reference called ``name``, as Markdown."""
    renderers: dict[str, Callable[[], str]] = {
        "settings": settings_reference,
        "cli": cli_reference,
        "metrics": metrics_reference,
    }
    if name not in renderers:
        raise ValueError(f"reference {name!r} is unknown; known: {', '.join(renderers)}")
    return renderers[name]()


def cell(text: object) -> str:
    """``text`` made safe for one cell of a Markdown table."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


# Settings


def settings_reference() -> str:
    """One table per group of ``Settings`` (``settings.paths``, ``settings.locks``...),
    each setting by its variable."""
    from warmup.core.settings import Settings

    header = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    sections: dict[str, list[str]] = {}
    for variable, attribute, field in Settings.fields():
        group = attribute.partition(".")[0]
        kind = cell(type_name(field.annotation) + limits(field.metadata))
        meaning = cell(f"`settings.{attribute}`: {field.description or ''}")
        row = f"| `{variable}` | {kind} | {default_text(field)} | {meaning} |"
        sections.setdefault(group, []).append(row)
    parts = []
    for group, rows in sections.items():
        about = cell(Settings.model_fields[group].description or "")
        parts.append(f"### {group}\n\n{about}\n\n" + "\n".join([*header, *rows]) + "\n")
    return "\n".join(parts)


def type_name(annotation: Any) -> str:
    """A field's type as the environment spells its values."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(str(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(str(member.value) for member in annotation)
    names = {bool: "true or false", int: "integer", float: "number", str: "text"}
    if annotation in names:
        return names[annotation]
    return "path" if getattr(annotation, "__name__", "") == "Path" else str(annotation)


def limits(metadata: list[Any]) -> str:
    """The bounds pydantic checks (``Field(ge=1, le=8)``), as ``, ≥ 1, ≤ 8``."""
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    found = [
        f"{sign} {getattr(item, bound)}"
        for item in metadata
        for bound, sign in signs.items()
        if getattr(item, bound, None) is not None
    ]
    return "".join(f", {bound}" for bound in found)


def default_text(field: Any) -> str:
    if field.default_factory is not None:
        return "derived"  # from other settings: the description says how
    if field.is_required():
        return "required"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{cell(value)}`" if str(value) else "`''`"


# Command line


@contextmanager
def embedded_settings() -> Iterator[Any]:
    """``Settings()`` on its embedded defaults, whatever the builder's environment holds."""
    from warmup.core.settings import Settings

    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    saved = {key: value for key, value in os.environ.items() if key.upper().startswith(prefix)}
    for key in saved:
        del os.environ[key]
    try:
        yield Settings()
    finally:
        os.environ.update(saved)


def cli_reference() -> str:
    from warmup.cli import build_parser

    with embedded_settings() as settings:
        parser = build_parser(settings)
    parts = []
    for words, command, summary in commands(parser, [parser.prog], ""):
        level = "#" * min(len(words) + 1, 6)
        parts.append(f"{level} {' '.join(words)}\n")
        if summary:
            parts.append(sentence(summary) + "\n")
        parts.append(f"```text\n{usage(command)}```\n")
        table = arguments(command)
        if table:
            parts.append(table)
    return "\n".join(parts)


def sentence(text: str) -> str:
    """A help line as a sentence: capital first, one full stop, Markdown's backticks."""
    text = text.replace("``", "`").rstrip(".")
    return f"{text[0].upper()}{text[1:]}."


def commands(
    parser: argparse.ArgumentParser, words: list[str], summary: str
) -> Iterator[tuple[list[str], argparse.ArgumentParser, str]]:
    """Every command under ``parser``, depth first, with its one-line help."""
    yield words, parser, summary or (parser.description or "")
    for action in parser._actions:  # argparse keeps its sub-commands only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from commands(sub, [*words, name], helps.get(name, ""))


def usage(parser: argparse.ArgumentParser) -> str:
    """The command's usage lines, at a fixed width, without argparse's ``usage:``."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=USAGE_WIDTH)
    lead = "usage: "
    lines = parser.format_usage().removeprefix(lead).splitlines(keepends=True)
    return lines[0] + "".join(line.removeprefix(" " * len(lead)) for line in lines[1:])


def arguments(parser: argparse.ArgumentParser) -> str:
    """A table of the command's own arguments (sub-commands have sections of their own)."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(action.option_strings) or (action.metavar or action.dest)
        rows.append(f"| `{cell(name)}` | {cell(value_text(action))} | {cell(help_text(action))} |")
    if not rows:
        return ""
    return "\n".join(["| argument | value | what |", "| --- | --- | --- |", *rows]) + "\n"


def value_text(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:
        return ""
    if action.choices is not None:
        values = (getattr(choice, "value", choice) for choice in action.choices)
        return " or ".join(str(value) for value in values)
    return str(action.metavar or action.dest).upper()


def help_text(action: argparse.Action) -> str:
    text = action.help if action.help not in (None, argparse.SUPPRESS) else ""
    if "%(" in text:
        text = text % {**vars(action), "default": action.default}
    return text


# Metrics


def metrics_reference() -> str:
    from prometheus_client import CollectorRegistry

    parts = []
    for module_name, writer in METRICS_MODULES.items():
        module = importlib.import_module(module_name)
        for name, cls in metrics_classes(module):
            registry = CollectorRegistry()
            instance = cls(registry=registry)
            doc = inspect.getdoc(cls) or ""
            first = doc.split("\n\n")[0].replace("\n", " ")
            parts.append(f"## `{name}`\n\nWritten by {writer}. {first}\n")
            parts.append(metrics_table(registry, instance))
    return "\n".join(parts)


def metrics_classes(module: types.ModuleType) -> list[tuple[str, type]]:
    """The module's public classes named ``*Metrics`` that take ``registry=``."""
    found = []
    for name, value in vars(module).items():
        if name.startswith("_") or not name.endswith("Metrics") or not inspect.isclass(value):
            continue
        if "registry" in inspect.signature(value).parameters:
            found.append((name, value))
    return sorted(found)


def metrics_table(registry: Any, instance: object) -> str:
    labels = declared_labels(instance)
    rows = ["| metric | type | labels | what |", "| --- | --- | --- | --- |"]
    for family in registry.collect():
        names = labels.get(family.name)
        if names is None:  # a custom collector: its samples carry the labels
            names = tuple(dict.fromkeys(k for s in family.samples for k in s.labels))
        exposed = family.name + ("_total" if family.type == "counter" else "")
        label_text = ", ".join(names)
        rows.append(
            f"| `{exposed}` | {family.type} | {cell(label_text)} | {cell(family.documentation)} |"
        )
    return "\n".join(rows) + "\n"


def declared_labels(instance: object) -> dict[str, tuple[str, ...]]:
    """Label names of the metrics an object's class declares (``MetricField``), by name:
    a labelled metric with no child yet has no sample to read them from."""
    from warmup.core.metrics import MetricField

    return {
        field.name: field.labels
        for klass in type(instance).__mro__
        for field in vars(klass).values()
        if isinstance(field, MetricField)
    }
