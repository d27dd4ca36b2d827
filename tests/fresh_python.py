"""Run code in a new Python interpreter: for what a process loads at start-up (sys.modules),
which the test process itself has long since loaded.

    from tests.fresh_python import run_fresh

    assert run_fresh("import sys, tracedb; print('tracedb.replay' in sys.modules)") == ["False"]
"""

from __future__ import annotations

import subprocess
import sys


def run_fresh(code: str, timeout_s: float = 60) -> list[str]:
    """`code` run by `python -c` in a new process; its standard output split into words. The
    process must exit 0 (its standard error is the failure message otherwise)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()
