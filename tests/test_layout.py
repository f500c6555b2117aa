"""The architecture's one-way rules, read from the sources: ``warmup -> kernels ->
registry``; inside ``registry/`` and ``warmup/`` each module stands on a floor and
imports only its own room or the floors below; no import loop anywhere, counting the
imports inside functions (``TYPE_CHECKING`` ones aside); and an import inside a function
says on its line why it waits."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TOP = ("registry", "kernels", "warmup")

# Each package's floors, top first: a room may import its own modules and any room on a
# floor below; never a room beside it or above it. "." is the package's own top-level
# modules (its entry points, for warmup/; the public face, for registry/).
FLOORS: dict[str, list[set[str]]] = {
    "registry": [
        {"."},
        {"cli"},
        {"bundles"},
        {"families"},
        {"remote"},
        {"caches"},
        {"storage"},
        {"locks"},
        {"trust"},
        {"core"},
    ],
    "warmup": [
        {"."},
        {"run", "sidecar", "serving"},
        {"caches"},
        {"compiled", "tuning"},
        {"core"},
    ],
    "kernels": [{"."}],
}


def modules() -> dict[str, Path]:
    """Every product module by dotted name (a package by its own name)."""
    found = {}
    for top in TOP:
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def _resolve(name: str) -> str | None:
    """The module that ``name`` (a module, or a name inside one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for child in ast.walk(node))
    return inside


def _in_functions(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside a function's body."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    return inside


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The project modules an import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        subs = [f"{base}.{alias.name}" for alias in node.names]
        names = [s for s in subs if s in MODULES] or [base]
        if len(names) < len(subs):
            names.append(base)
    found = {_resolve(n) for n in names if n.split(".")[0] in TOP}
    return {t for t in found if t and t != module}


def imports() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Each module's project imports at any depth, and every import inside a function
    (module, line, the line's text)."""
    edges: dict[str, set[str]] = defaultdict(set)
    lazy: list[tuple[str, int, str]] = []
    for module, path in MODULES.items():
        source = path.read_text()
        tree = ast.parse(source)
        skip, inner = _checking_only(tree), _in_functions(tree)
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
                continue
            edges[module].update(_targets(module, path, node))
            if id(node) in inner:
                lazy.append((module, node.lineno, lines[node.end_lineno - 1]))
    return edges, lazy


EDGES, LAZY = imports()


def room_of(module: str) -> tuple[str, str]:
    """``(package, room)``: the room is the subpackage right below the package, or "."."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (ROOT / parts[0] / parts[1]).is_dir()):
        return parts[0], parts[1]
    return parts[0], "."


def floor_of(module: str) -> int:
    package, room = room_of(module)
    for level, rooms in enumerate(FLOORS[package]):
        if room in rooms:
            return level
    raise AssertionError(f"{module}: room {package}/{room} is on no floor of tests/test_layout.py")


def test_dependencies_point_one_way():
    rank = {top: i for i, top in enumerate(TOP)}  # a package imports only those before it
    upward = [
        (module, name)
        for module, names in EDGES.items()
        for name in names
        if rank[name.split(".")[0]] > rank[module.split(".")[0]]
    ]
    assert not upward


def test_every_room_has_a_floor():
    for module in MODULES:
        floor_of(module)


def test_rooms_import_only_their_own_or_the_floors_below():
    wrong = []
    for module, names in EDGES.items():
        for name in names:
            if name.split(".")[0] != module.split(".")[0] or room_of(name) == room_of(module):
                continue
            if floor_of(name) <= floor_of(module):
                wrong.append(f"{module} -> {name}")
    assert not wrong, "imports sideways or up a floor:\n" + "\n".join(sorted(wrong))


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(set(edges) | {n for ns in edges.values() for n in ns}):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_loops_finds_a_loop():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_loop():
    assert not loops(EDGES)


@pytest.mark.parametrize("module, line, text", LAZY, ids=[f"{m}:{n}" for m, n, _ in LAZY])
def test_an_import_inside_a_function_says_why(module, line, text):
    assert "#" in text, f"{module}:{line}: say on the line why this import waits"
