"""Plain YAML (or JSON) from untrusted text, in bounded time and memory.

The data is built straight from the parser's events (libyaml's where installed) with
the limits checked on the way, so nothing past a limit is ever built: one document, no
anchors or aliases (an alias bomb is a small graph of a huge object), no duplicate keys,
no tags beyond YAML's plain types (``!!python/...``, merge keys), at most
:data:`MAX_DEPTH` levels and :data:`MAX_NODES` values, lists and mappings, no integer
literal longer than :data:`MAX_INT_CHARS`. Every refusal is a :class:`Refused` whose
arguments are one line each.
"""

from __future__ import annotations

import codecs
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any

import yaml

try:  # libyaml's parser: the same events, several times faster
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

MAX_DEPTH = 16  # a valid manifest nests 7 deep
MAX_NODES = 200_000  # a manifest within its shape limit needs fewer than 150,000
MAX_INT_CHARS = 64  # int() of thousands of digits is slow, then refused
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_SHORT.maxlist = _SHORT.maxdict = 6


class Refused(Exception):
    """The text passes a limit or is not YAML: its error lines, found before validation."""


def too_big(size: int | None, limit: int, what: str) -> str:
    found = f"more than {limit}" if size is None else str(size)
    return f"{found} bytes; {what} is at most {limit}"


def decode(text: str | bytes, limit: int, what: str) -> str:
    """Strict UTF-8 of at most ``limit`` bytes (a UTF-8 BOM is dropped); a str is checked
    as the bytes it would be in a file. ``what`` names the document in a refusal."""
    if isinstance(text, str):
        if len(text) > limit:  # each character is at least one byte
            raise Refused(too_big(None, limit, what))
        text = text.encode("utf-8", "surrogatepass")  # a lone surrogate fails the decode
    if len(text) > limit:
        raise Refused(too_big(len(text), limit, what))
    skip = len(codecs.BOM_UTF8) if text.startswith(codecs.BOM_UTF8) else 0
    try:
        decoded = text[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Refused(_not_utf8(text, skip + e.start)) from None
    if "\0" in decoded:  # UTF-16 without a BOM decodes, NULs and all
        raise Refused(_not_utf8(text, text.index(b"\0")))
    return decoded


def _not_utf8(data: bytes, offset: int) -> str:
    return f"not UTF-8 text (byte 0x{data[offset]:02x} at offset {offset})"


def load(text: str, source: str) -> Any:
    """The one document in ``text`` as plain data; :class:`Refused` past any limit."""
    try:
        return _Builder().build(text)
    except yaml.YAMLError as e:
        # a parser may refuse deep flow nesting by a limit of its own before an event
        # reaches the builder (libyaml scans 1,000 ``[`` ahead): ours is named either way
        mark = getattr(e, "problem_mark", None)
        line = _flow_too_deep(text, mark.index + 1 if mark else len(text))
        if line:
            raise Refused(_too_deep(line)) from None
        raise Refused(_yaml_error(e, source, text)) from None


def _too_deep(line: int) -> str:
    return f"nesting deeper than {MAX_DEPTH} levels: line {line}"


_FLOW_TOKEN = re.compile(
    r"""[\[{\]}\n]  # a flow collection's start or end, a line break
    | (?:^|(?<=[\s\[{,:]))  # at a token's start:
      (?: \#[^\n]*  # a comment
        | '(?:[^']|'')*'?  # a single-quoted scalar (a quote doubles)
        | "(?:[^"\\]|\\.)*"?  # a double-quoted scalar (backslash escapes)
      )""",
    re.S | re.X,
)


def _flow_too_deep(text: str, end: int) -> int:
    """The line at which ``text[:end]`` (up to the refused token) opens more than
    :data:`MAX_DEPTH` flow collections (quoted scalars and comments skipped), or 0: a
    lexical count, asked only of a text the parser refused, so it chooses the message and
    never refuses a valid document."""
    depth, line = 0, 1
    for token in _FLOW_TOKEN.finditer(text, 0, end):
        char = token.group()[0]
        if char == "\n":
            line += 1
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line
        elif char in "]}":
            depth = max(0, depth - 1)
        else:
            line += token.group().count("\n")  # a quoted scalar may span lines
    return 0


@dataclass(slots=True)
class _Open:
    """A list or mapping still being filled; a mapping's pending key and keys' lines."""

    value: list[Any] | dict[Any, Any]
    key: Any = None
    has_key: bool = False
    lines: dict[Any, tuple[int, int]] = field(default_factory=dict)  # key -> (line, column)


class _Builder:
    """The data, built straight from the parser's events with the limits checked on the
    way: no YAML node graph is ever composed (an alias bomb is a small graph of a huge
    object, and composing costs several times what the rest of the load does)."""

    def __init__(self) -> None:
        self.scalars = _Scalars()
        self.stack: list[_Open] = []  # open lists and mappings, innermost last
        self.root: list[Any] = []
        self.nodes = self.documents = 0
        self.duplicates: list[str] = []

    def build(self, text: str) -> Any:
        for event in yaml.parse(text, Loader=_BaseLoader):
            if isinstance(event, yaml.NodeEvent):
                self._node(event, _where(event))
            elif isinstance(event, yaml.CollectionEndEvent):
                self.stack.pop()
            elif isinstance(event, yaml.DocumentStartEvent):
                self.documents += 1
                if self.documents > 1:
                    raise Refused(f"more than one YAML document: line {_where(event)[0]}")
        if self.duplicates:
            raise Refused(*self.duplicates)
        return self.root[0] if self.root else None

    def _node(self, event: yaml.NodeEvent, where: tuple[int, int]) -> None:
        line = where[0]
        if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
            raise Refused(f"YAML aliases and anchors are not allowed: line {line}")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise Refused(
                f"more than {MAX_NODES} YAML nodes (values, lists, mappings): line {line}"
            )
        if isinstance(event, yaml.ScalarEvent):
            self._add(self.scalars.value(event, line), where)
            return
        assert isinstance(event, yaml.CollectionStartEvent)  # the last kind of NodeEvent
        if event.tag not in _COLLECTION_TAGS:
            raise Refused(f"line {line}: YAML tag {_tag(event.tag)} is not allowed")
        value: list[Any] | dict[Any, Any] = [] if isinstance(event, yaml.SequenceStartEvent) else {}
        self._add(value, where)
        self.stack.append(_Open(value))
        if len(self.stack) > MAX_DEPTH:
            raise Refused(_too_deep(line))

    def _add(self, value: Any, where: tuple[int, int]) -> None:
        if not self.stack:
            self.root.append(value)
            return
        top = self.stack[-1]
        if isinstance(top.value, list):
            top.value.append(value)
        elif top.has_key:
            top.value[top.key] = value
            top.has_key = False
        elif isinstance(value, (list, dict)):
            raise Refused(f"a list or mapping as a mapping key: line {where[0]}")
        else:
            if value in top.lines:
                both = _both(top.lines[value], where)
                self.duplicates.append(f"duplicate key {short(value)} at {both}")
            top.lines.setdefault(value, where)
            top.key, top.has_key = value, True


_STR, _INT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int"
_COLLECTION_TAGS = {None, "!", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"}


class _Scalars(yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """PyYAML's own type resolution and safe constructors, one scalar at a time; each
    distinct scalar once (a manifest repeats its 8s, Ms and bf16s)."""

    def __init__(self) -> None:
        yaml.constructor.SafeConstructor.__init__(self)  # as PyYAML's loaders: each base's own
        yaml.resolver.Resolver.__init__(self)
        self.seen: dict[tuple[Any, ...], Any] = {}  # (tag, implicit, text) -> value (immutable)

    def value(self, event: yaml.ScalarEvent, line: int) -> Any:
        key = (event.tag, event.implicit, event.value)
        if key not in self.seen:
            self.seen[key] = self._construct(event, line)
        return self.seen[key]

    def _construct(self, event: yaml.ScalarEvent, line: int) -> Any:
        tag = event.tag
        if tag is None or tag == "!":  # as PyYAML's composer resolves it
            tag = self.resolve(yaml.ScalarNode, event.value, event.implicit)  # type: ignore[no-untyped-call]
        if tag == _STR:
            return event.value  # most scalars: nothing to construct
        constructor = self.yaml_constructors.get(tag)
        if constructor is None:  # merge keys, !!python/..., unknown tags
            raise Refused(f"line {line}: YAML tag {_tag(tag)} is not allowed")
        if tag == _INT and len(event.value) > MAX_INT_CHARS:
            raise Refused(
                f"line {line}: an integer of {len(event.value)} characters; at most {MAX_INT_CHARS}"
            )
        marks: tuple[Any, Any] = (event.start_mark, event.end_mark)  # libyaml's or PyYAML's
        node = yaml.ScalarNode(tag, event.value, marks[0], marks[1], event.style)
        try:
            return constructor(self, node)
        except (ValueError, KeyError, AttributeError, TypeError) as e:
            # an explicit tag hands any text to int(), float(), a dict or a regex match
            raise Refused(
                f"line {line}: {_tag(tag)} {short(event.value)} is refused: "
                f"{type(e).__name__}: {clip(str(e))}"
            ) from None


def _tag(tag: str | None) -> str:
    return clip(str(tag).replace("tag:yaml.org,2002:", "!!"), 60)


def _where(node: yaml.Node | yaml.Event) -> tuple[int, int]:
    mark = node.start_mark
    return (mark.line + 1, mark.column + 1) if mark else (0, 0)  # the parser's have marks


def _both(first: tuple[int, int], second: tuple[int, int]) -> str:
    if first[0] == second[0]:  # a one-line JSON or flow mapping
        return f"line {first[0]}, columns {first[1]} and {second[1]}"
    return f"lines {first[0]} and {second[0]}"


def _yaml_error(error: yaml.YAMLError, source: str, text: str) -> str:
    """``file:line:column: problem``, then the line with a caret under the column."""
    if isinstance(error, yaml.reader.ReaderError):  # a character YAML refuses: no line known
        where = f"#x{error.character:04x} at character {error.position}"
        return f"not YAML or JSON: {error.reason} ({where})"
    mark = getattr(error, "problem_mark", None)
    problem = clip(getattr(error, "problem", None) or str(error))
    if mark is None:
        return f"not YAML or JSON: {problem}"
    context = getattr(error, "context", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}"
    return (
        f"not YAML or JSON at {where}: {problem}"
        + (f" ({clip(context)})" if context else "")
        + _caret(text, mark.line, mark.column)
    )


_YAML_BREAK = re.compile(r"\r\n|[\r\n\x85\u2028\u2029]")


def _caret(text: str, line: int, column: int) -> str:
    """The line (100 characters of it at most) with a caret under the column."""
    lines = _YAML_BREAK.split(text, maxsplit=line + 1)
    start = max(0, column - 60)
    shown = lines[line][start : start + 100] if line < len(lines) else ""
    return f"\n      {shown}\n      {' ' * (column - start)}^" if shown.strip() else ""


def clip(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters (a source line, a YAML problem)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any) -> str:
    """A value's repr cut to a readable length (a hostile one may be a megabyte)."""
    return _SHORT.repr(value)
