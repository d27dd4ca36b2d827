"""The README's shell completion line, exactly as written, in the ~/.bashrc of an interactive
bash: silent where `tracedb` is not on PATH (a new user who runs `.venv/bin/tracedb`), and
completing `tracedb` where it is."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import subprocess
import sys
import termios

import pytest

from .conftest import ROOT, SYSTEM_PATH

BIN = os.path.dirname(sys.executable)


def readme_line() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        (line,) = re.findall(r"`([^`]*_TRACEDB_COMPLETE=bash_source[^`]*)`", f.read())
    return line


def interactive_bash(home, path: str) -> subprocess.CompletedProcess:
    """`bash -i` reading `home`/.bashrc, on a terminal of its own (so that job control says
    nothing); its standard output and error captured apart."""
    primary, terminal = pty.openpty()
    try:
        return subprocess.run(
            ["bash", "-ic", "complete -p tracedb 2>/dev/null || echo no-completion"],
            stdin=terminal, capture_output=True, text=True, timeout=60, start_new_session=True,
            env={"HOME": str(home), "PATH": path, "TERM": "dumb"},
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
    finally:
        os.close(terminal)
        os.close(primary)


@pytest.fixture
def home(tmp_path):
    (tmp_path / ".bashrc").write_text(readme_line() + "\n")
    return tmp_path


def test_without_tracedb_on_path_the_line_says_nothing(home):
    r = interactive_bash(home, SYSTEM_PATH)
    assert r.stderr == "" and r.stdout == "no-completion\n", r.stderr


def test_with_tracedb_on_path_the_line_completes_it(home):
    if not os.path.exists(os.path.join(BIN, "tracedb")):
        pytest.skip("the tracedb console script is not installed next to this Python")
    r = interactive_bash(home, f"{BIN}:{SYSTEM_PATH}")
    assert r.stderr == "", r.stderr
    assert r.stdout.split()[-1] == "tracedb" and "-F _tracedb_completion" in r.stdout
