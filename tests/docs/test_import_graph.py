"""The import graph of tracedb/ and wal/ has no cycle: no module imports, at import time, one that
imports it back, directly or through others (docs/modules.md). Imports inside functions and
under `if TYPE_CHECKING:` are left out (they run later, or never), and so is a module's import
of the package it belongs to."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tracedb", "wal")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(tree: ast.Module, name: str, is_package: bool) -> set:
    """The modules `name` imports when it is imported."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                out.add(base)
                out.update(f"{base}.{alias.name}" for alias in node.names)

    visit(tree.body)
    return out


def graph() -> dict:
    modules = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            modules[_module_name(path)] = path
    edges = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _top_level_imports(tree, name, path.name == "__init__.py")
        # A submodule may import its own package (`from wal import errors`): the package is in
        # sys.modules before its __init__ runs, as Python imports packages.
        edges[name] = {m for m in imported if m in modules and m != name and not name.startswith(m + ".")}
    return edges


def cycles(edges: dict) -> list:
    """Each strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_the_import_graph_has_no_cycle():
    edges = graph()
    assert len(edges) > 60 and edges["tracedb.recorder.store"]  # the walk found the modules and their imports
    assert cycles(edges) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
