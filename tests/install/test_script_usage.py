"""The two commands' usage: `scripts/test --help` and `scripts/setup --help` answer at once,
installing nothing, and say where their arguments go."""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("script, says", [
    ("test", ["usage: scripts/test [PYTEST-ARGUMENT...]", "scripts/test tests/store -x", "TRACEDB_TEST_PG_URL"]),
    ("setup", ["usage: scripts/setup [EXTRA...]"]),
])
def test_a_scripts_help_is_its_own_and_installs_nothing(script, says, tmp_path):
    stamp = os.path.join(ROOT, ".venv", ".tracedb-installed")
    before = os.stat(stamp).st_mtime_ns if os.path.exists(stamp) else None
    r = subprocess.run([os.path.join(ROOT, "scripts", script), "--help"], capture_output=True, text=True,
                       timeout=30, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for text in says:
        assert text in r.stdout
    assert (os.stat(stamp).st_mtime_ns if os.path.exists(stamp) else None) == before
