"""The commands tracedb prints for its user to run, named so that they run as printed.

The `pip` on PATH is often another interpreter's, so an install hint names this interpreter's pip.
"""

from __future__ import annotations

import shlex
import sys


def pip_install(requirement: str) -> str:
    """`pip install` for this interpreter: `<python> -m pip install <requirement>`."""
    return f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(requirement)}"


def extra_hint(extra: str) -> str:
    """The hint of a feature that needs one of tracedb's extras: the command for a checkout's
    .venv, and the one for an environment tracedb was installed into."""
    return (f"install the {extra} extra: `scripts/setup {extra}` in a tracedb checkout, or "
            f"`{pip_install(f'tracedb[{extra}]')}` where tracedb was installed with pip")
