"""The fenced code blocks of the documentation, with the mark each may carry.

A command or Python block (```sh, ```bash, ```console, ```python) is run by
``tests/docs/test_blocks.py`` as written, unless an HTML comment on the line right
before its fence says otherwise:

- ``<!-- not-runnable: REASON -->``: never run; the reason says what it needs (a GPU, a
  cluster) or why running it proves nothing;
- ``<!-- tested-by: tests/PATH.py::TEST -->``: that test runs it (it reads the block
  from the page, so the page's path is in the test's file).

A ```console block is a transcript: ``$ `` starts a command, the lines after it are
what the command prints (stdout and stderr), where ``...`` stands for any text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]
COMMANDS = frozenset({"sh", "bash", "console", "python"})
FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,})(?P<lang>[^`\s]*)\s*$")
MARK = re.compile(r"^ *<!-- (?P<kind>not-runnable|tested-by): (?P<note>.+?) -->$")
ANY_MARK = re.compile(r"<!-- *(not-runnable|tested-by)\b")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    mark: str | None  # "not-runnable", "tested-by" or None: run as written
    note: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found, number = [], 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        indent, ticks = opening.group("indent"), opening.group("ticks")
        end = number + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line.removeprefix(indent) for line in lines[number + 1 : end]]
        mark = MARK.match(lines[number - 1]) if number else None
        found.append(
            Block(
                page=page,
                line=number + 1,
                lang=opening.group("lang"),
                text="\n".join(body) + "\n",
                mark=mark.group("kind") if mark else None,
                note=mark.group("note").strip() if mark else "",
            )
        )
        number = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in blocks(path)]


def stray_marks(path: Path) -> list[str]:
    """Marks that are malformed or not right before a fence: ``page:line`` each."""
    lines = path.read_text().splitlines()
    page = str(path.relative_to(ROOT))
    bad = []
    for number, line in enumerate(lines):
        if not ANY_MARK.search(line):
            continue
        before_fence = number + 1 < len(lines) and FENCE.match(lines[number + 1])
        if not MARK.match(line) or not before_fence:
            bad.append(f"{page}:{number + 1}")
    return bad


def transcript(text: str) -> list[tuple[str, str]]:
    """A console block's commands, each with the output it shows."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"output before the first command: {line!r}")
    return [(command, "\n".join(output).rstrip()) for command, output in steps]


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected``, where ``...`` in ``expected`` stands for any text."""
    pattern = ".*?".join(re.escape(piece) for piece in expected.split("..."))
    return re.fullmatch(pattern, actual.rstrip(), re.S) is not None
