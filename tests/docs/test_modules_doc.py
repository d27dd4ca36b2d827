"""docs/modules.md against the code: every module it names exists, every module is named, and each
`module` `function` of "The life of an event" is defined in that module."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "modules.md"
PACKAGES = ("tracedb", "wal")
TICKED = re.compile(r"`([^`]+)`")
PY = re.compile(r"^[\w/]+\.py$")
STEP = re.compile(r"^\d+\. ")
NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


def _sections():
    """(heading, lines) for each `## ` section of the document."""
    heading, lines, out = "", [], []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            out.append((heading, lines))
            heading, lines = line, []
        else:
            lines.append(line)
    out.append((heading, lines))
    return out


def _bases(heading: str) -> tuple:
    """Where a module path in this section is relative to: its package, else the repository."""
    for pkg in PACKAGES:
        if heading.startswith(f"## `{pkg}/`"):
            return (pkg,)
    return ("", *PACKAGES)


def _resolve(path: str, bases: tuple):
    for base in bases:
        candidate = ROOT / base / path
        if candidate.is_file():
            return candidate.resolve()
    return None


def named_modules():
    """{resolved file or None: the path as written} for every `*.py` the document names."""
    found = {}
    for heading, lines in _sections():
        bases = _bases(heading)
        for line in lines:
            for token in TICKED.findall(line):
                if PY.match(token):
                    found.setdefault(_resolve(token, bases), []).append(token)
    return found


def test_every_named_module_exists():
    missing = named_modules().get(None, [])
    assert not missing, f"docs/modules.md names modules that do not exist: {sorted(set(missing))}"


def test_every_module_is_named():
    named = set(named_modules())
    unlisted = [
        str(path.relative_to(ROOT))
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
        if path.name != "__init__.py" and path.resolve() not in named
    ]
    assert not unlisted, f"modules missing from docs/modules.md: {unlisted}"


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether the module defines `name` (a function, class or assignment) or `Class.method`."""
    first, _, attr = name.partition(".")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == first:
            if not attr:
                return True
            return isinstance(node, ast.ClassDef) and any(
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr for n in node.body
            )
        if not attr and isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == first for t in targets):
                return True
    return False


def life_pairs():
    """(module, name) for each name the life-of-an-event section gives a module for: the name
    right after a module path, and every `Class.method` after it in the same numbered step."""
    sections = [lines for heading, lines in _sections() if heading == "## The life of an event"]
    assert sections, 'docs/modules.md has no section "The life of an event"'
    pairs = []
    for line in sections[0]:
        if not STEP.match(line):
            continue
        module = previous = None
        for token in TICKED.findall(line):
            if PY.match(token):
                module = token
            elif module and NAME.match(token) and (previous == module or "." in token):
                pairs.append((module, token))
            previous = token
    return pairs


def test_life_of_an_event_names_real_functions():
    pairs = life_pairs()
    assert len(pairs) >= 20, pairs
    wrong = []
    for module, name in pairs:
        path = ROOT / module
        if not path.is_file() or not _defines(ast.parse(path.read_text(encoding="utf-8")), name):
            wrong.append(f"{module} {name}")
    assert not wrong, f"not defined where docs/modules.md says: {wrong}"


def test_the_check_catches_a_wrong_name():
    tree = ast.parse("class Store:\n    def event(self): pass\n\ndef load(): pass\nCOLUMNS = ()\n")
    assert _defines(tree, "Store.event") and _defines(tree, "load") and _defines(tree, "COLUMNS")
    assert not _defines(tree, "Store.evnt") and not _defines(tree, "Reader.get") and not _defines(tree, "lod")
