"""tracedb's imports stand at the top of its modules, except at its named lazy seams: an import
inside a function (listed in FUNCTION_IMPORTS, with why) and a module declared at a module's top
to be imported at its first use (`tracedb.imports.on_first_use`, listed in ON_FIRST_USE). A new
one fails here until it is moved to the module's top or named below with its reason, so that
imports scattered inside functions cannot creep back (docs/modules.md, "Start-up and the lazy
seams")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (module file, innermost function): why its import waits. A function may hold several imports.
FUNCTION_IMPORTS = {
    # The packages' names loaded when first asked for.
    ("tracedb/reads/__init__.py", "__getattr__"): "the reader and the replay engines it brings",
    ("tracedb/sidecar/__init__.py", "__getattr__"): "the client, and asyncio with it",
    ("tracedb/__init__.py", "_version"): "importlib.metadata, for __version__ alone",
    # The command line (its commands are imported through tracedb.cli.main.COMMANDS).
    ("tracedb/cli/main.py", "invoke"): "a failure's report (maintenance.admin) loads SQLAlchemy",
    ("tracedb/cli/interop.py", "export_command"): "the IntentusNet adapter loads IntentusNet's package",
    # What every command and `import tracedb` load, kept small.
    ("tracedb/config.py", "_from_file"): "tomllib, for a configuration file only",
    ("tracedb/config.py", "redactor"): "the redaction rules, for a recorder only",
    ("tracedb/config.py", "ensure_local_token"): "secrets and tempfile, for a listener's token only",
    ("tracedb/errors.py", "__init__"): "tracedb.program (shutil), for a missing extra's hint only",
    ("tracedb/records/record.py", "error"): "the outcomes' price table (decimal, genai-prices)",
    # The compactor's driver, stats' SQLAlchemy, the recorder's compactor process, the price table.
    ("tracedb/projection/compactor.py", "execute"): "psycopg, on PostgreSQL only",
    ("tracedb/reads/stats.py", "stats"): "SQLAlchemy, which a read command on SQLite does without",
    ("tracedb/reads/stats.py", "totals"): "SQLAlchemy, as above",
    ("tracedb/recorder/scheduler.py", "start_worker"): "the compactor process, when one starts",
    ("tracedb/recorder/scheduler.py", "compact_locked"): "the compactor process's error, as above",
    ("tracedb/recorder/scheduler.py", "_background_loop"): "the compactor process's check, as above",
    ("tracedb/recorder/store.py", "__del__"): "warnings, for a store never closed",
    ("tracedb/records/outcomes.py", "prices_version"): "genai-prices, at its first price",
    ("tracedb/records/outcomes.py", "_rates"): "genai-prices, as above",
    ("tracedb/records/outcomes.py", "price_usd"): "genai-prices, as above",
}
# No more imports inside functions than this, whatever the list above holds (164 before the seams).
MAX_FUNCTION_IMPORTS = 25

# (module file, name): the module `on_first_use` stands for there.
ON_FIRST_USE = {
    ("tracedb/reads/reader.py", "read_sql"): "tracedb.reads.sql",
    ("tracedb/reads/reader.py", "db"): "tracedb.projection.db",
    ("tracedb/reads/reader.py", "verifying"): "tracedb.maintenance.verify",
    ("tracedb/reads/reader.py", "asyncio"): "asyncio",
    ("tracedb/reads/wal_tail.py", "read_sql"): "tracedb.reads.sql",
    ("tracedb/projection/db.py", "alembic_command"): "alembic.command",
    ("tracedb/projection/db.py", "alembic_config"): "alembic.config",
    ("tracedb/projection/db.py", "alembic_migration"): "alembic.runtime.migration",
    ("tracedb/projection/db.py", "migrations"): "tracedb.migrations",
    ("tracedb/projection/db.py", "sa_asyncio"): "sqlalchemy.ext.asyncio",
    ("tracedb/projection/db.py", "aiosqlite"): "aiosqlite",
    ("tracedb/maintenance/admin.py", "intentusnet"): "tracedb.interop.intentusnet",
    ("tracedb/sidecar/run.py", "web"): "tracedb.web",
    ("tracedb/sidecar/run.py", "web_run"): "tracedb.web.run",
    ("tracedb/sidecar/run.py", "otlp_receiver"): "tracedb.otel.receiver",
    ("tracedb/sidecar/asgi.py", "h11"): "h11",
    ("tracedb/sidecar/asgi.py", "uvicorn"): "uvicorn",
    ("tracedb/sidecar/asgi.py", "h11_impl"): "uvicorn.protocols.http.h11_impl",
}


def function_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(innermost function, line) of every import statement inside a function."""
    out = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if function is not None and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((function, child.lineno))
            visit(child, function)

    visit(tree, None)
    return out


def _imported(nodes) -> dict[str, str]:
    """{bound name: module} of the imports among `nodes` (`import a.b as c`, `from a import b as c`)."""
    out = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def on_first_use_seams(tree: ast.Module) -> dict[str, tuple[str, bool]]:
    """{name: (module, whether an import of that module under TYPE_CHECKING binds the same name)}
    for every `name = on_first_use("module")` at a module's top, in an `if TYPE_CHECKING:`'s else."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        checked = "TYPE_CHECKING" in ast.unparse(node.test)
        seen = _imported(node.body) if checked else {}
        for stmt in node.orelse:
            call = stmt.value if isinstance(stmt, ast.Assign) else None
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "on_first_use":
                name, module = stmt.targets[0].id, call.args[0].value
                out[name] = (module, seen.get(name) == module)
    return out


def _sources():
    for path in sorted((ROOT / "tracedb").rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))


def test_imports_inside_functions_are_the_named_seams_alone():
    found: dict = {}
    for rel, tree in _sources():
        for function, line in function_imports(tree):
            found.setdefault((rel, function), []).append(line)
    unnamed = {k: v for k, v in found.items() if k not in FUNCTION_IMPORTS}
    assert not unnamed, f"imports inside functions: move them to the module's top, or name the seam here: {unnamed}"
    gone = sorted(set(FUNCTION_IMPORTS) - set(found))
    assert not gone, f"named seams that import nothing any more: drop them from FUNCTION_IMPORTS: {gone}"
    total = sum(len(lines) for lines in found.values())
    assert 0 < total <= MAX_FUNCTION_IMPORTS, total


def test_modules_imported_at_first_use_are_the_named_seams_alone_and_type_checkers_see_them():
    found = {}
    for rel, tree in _sources():
        if rel == "tracedb/imports.py":
            continue
        for name, (module, typed) in on_first_use_seams(tree).items():
            found[(rel, name)] = module
            assert typed, f"{rel}: {name} = on_first_use({module!r}) without `import {module}` under TYPE_CHECKING"
    assert found == ON_FIRST_USE
    # Nowhere else: a call of on_first_use outside such a block would escape the walk above.
    calls = [(rel, n.lineno) for rel, tree in _sources() if rel != "tracedb/imports.py"
             for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "on_first_use"]
    assert len(calls) == len(ON_FIRST_USE), calls


def test_the_walks_find_what_they_look_for():
    tree = ast.parse(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from a import b as c\n"
        "else:\n"
        "    c = on_first_use('a.b')\n"
        "    d = on_first_use('e')\n"
        "def f():\n"
        "    import json\n"
        "    def g():\n"
        "        from x import y\n"
        "    class K:\n"
        "        import z\n"
    )
    assert function_imports(tree) == [("f", 9), ("g", 11), ("f", 13)]
    assert on_first_use_seams(tree) == {"c": ("a.b", True), "d": ("e", False)}
