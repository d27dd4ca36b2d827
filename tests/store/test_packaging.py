"""What the distribution installs: the schema's revisions inside tracedb, no bench code."""

import os
import tomllib

import tracedb.migrations

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _setuptools() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_migrations_install_inside_tracedb_not_as_a_top_level_package():
    st = _setuptools()
    top_level = {p.split(".")[0] for p in st["packages"]}
    assert top_level == {"tracedb", "wal"}
    assert st["package-dir"]["tracedb.migrations"] == "migrations"
    # The revisions Alembic runs are the files of the project's top-level migrations/ folder.
    here = os.path.dirname(os.path.abspath(tracedb.migrations.__file__))
    assert here == os.path.join(ROOT, "migrations")
    assert "0001_initial.py" in os.listdir(os.path.join(here, "versions"))


def test_every_package_of_the_source_tree_is_installed():
    st = _setuptools()
    found = set()
    for top in ("tracedb", "wal"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                found.add(os.path.relpath(dirpath, ROOT).replace(os.sep, "."))
    assert found <= set(st["packages"]), f"not installed: {sorted(found - set(st['packages']))}"
    assert not any("bench" in p for p in st["packages"])
