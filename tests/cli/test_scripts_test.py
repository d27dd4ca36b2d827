"""`scripts/test` says why tests skip: with no PostgreSQL server, the PostgreSQL tests skip and
the summary gives the reason (the README promises it). Its `--help`, and `scripts/setup`'s,
answer at once and install nothing."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(600)


def test_the_postgresql_tests_say_why_they_skip_without_a_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    env = dict(os.environ, TRACEDB_TEST_PG_URL=f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    r = subprocess.run(
        [os.path.join(ROOT, "scripts", "test"), "-p", "no:cacheprovider", "tests/pg/test_pg_cli.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    skipped = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped, r.stdout[-3000:]
    assert all(f"no PostgreSQL server answers at postgresql+psycopg://postgres@127.0.0.1:{port}/test" in line
               for line in skipped), skipped


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
