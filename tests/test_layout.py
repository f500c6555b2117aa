"""The architecture's one-way rules, read from the sources: ``warmup -> kernels ->
registry``, and no package of ``warmup/`` imports one that imports it back."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).parents[1]
TOP = ("registry", "kernels", "warmup")


def imports() -> dict[str, set[str]]:
    """Each module's project imports (at any depth: lazy ones count), by dotted name."""
    found: dict[str, set[str]] = defaultdict(set)
    for top in TOP:
        for path in (ROOT / top).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                found[module].update(n for n in names if n.split(".")[0] in TOP)
    return found


def package_of(module: str) -> str | None:
    """The subpackage of ``warmup`` a module is in (``warmup.run``), or None."""
    parts = module.split(".")
    if len(parts) > 2 and parts[0] == "warmup" and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return None


def test_dependencies_point_one_way():
    rank = {top: i for i, top in enumerate(TOP)}  # a package imports only those before it
    upward = [
        (module, name)
        for module, names in imports().items()
        for name in names
        if rank[name.split(".")[0]] > rank[module.split(".")[0]]
    ]
    assert not upward


def test_no_package_of_warmup_imports_one_that_imports_it_back():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, names in imports().items():
        source = package_of(module)
        for name in names:
            target = package_of(name)
            if source and target and source != target:
                edges[source].add(target)
    loops = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, ()))
    assert not loops
