"""Helpers for the install tests: a copy of what an install reads from the checkout, and an
environment in which no `tracedb` is on PATH."""

from __future__ import annotations

import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# The interpreter this checkout's .venv was made from.
BASE_PYTHON = os.path.realpath(sys.executable)


def copy_checkout(dest: str) -> str:
    """The files `pip install` and scripts/setup read, copied to `dest` (no .venv, no build output)."""
    os.makedirs(dest)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), dest)
    for name in ("scripts", "tracedb", "wal", "migrations"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(dest, name),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def plain_env(**extra: str) -> dict:
    """This environment without tracedb's variables, any virtualenv, or the venv's bin on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRACEDB_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PATH")}
    return dict(env, PATH=SYSTEM_PATH, **extra)
