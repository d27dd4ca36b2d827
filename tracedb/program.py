"""The commands tracedb prints for its user to run, named so that they run as printed.

tracedb is often started by a path (`.venv/bin/tracedb`, `/opt/tracedb/.venv/bin/tracedb`) with no
`tracedb` on PATH, and the `pip` on PATH is often another interpreter's. So a suggested command
names the program as it was started unless `tracedb` on PATH is this same installation, and an
install hint names this interpreter's pip.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from typing import Optional

NAME = "tracedb"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def program() -> str:
    """The command line that runs this tracedb, for a command printed to the user: `tracedb`
    when that name on PATH is this installation, else the way it was started (`.venv/bin/tracedb`,
    `/usr/bin/python3 -m tracedb`). Inside another program (an agent, a test), `tracedb`."""
    started = sys.argv[0] if sys.argv else ""
    on_path = shutil.which(NAME)
    if os.path.basename(started) == NAME:  # the console script
        if on_path and _same_file(on_path, started):
            return NAME
        return shlex.quote(started)
    if started.endswith(os.path.join(NAME, "__main__.py")):  # python -m tracedb
        script = os.path.join(os.path.dirname(sys.executable), NAME)
        if on_path and _same_file(on_path, script):
            return NAME
        return f"{shlex.quote(sys.executable)} -m {NAME}"
    return NAME


_COMMAND = re.compile(r"`tracedb(?=[ `])")


def as_invoked(text: Optional[str]) -> Optional[str]:
    """`text` with each command it quotes (`` `tracedb recover` ``) naming `program()`: for the
    hints and notes the library writes, printed by the command line."""
    if not text:
        return text
    name = program()
    if name == NAME:
        return text
    return _COMMAND.sub(lambda _m: "`" + name, text)


def pip_install(requirement: str) -> str:
    """`pip install` for this interpreter: `<python> -m pip install <requirement>`."""
    return f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(requirement)}"


def extra_hint(extra: str) -> str:
    """The hint of a feature that needs one of tracedb's extras: the command for a checkout's
    .venv, and the one for an environment tracedb was installed into."""
    return (f"install the {extra} extra: `scripts/setup {extra}` in a tracedb checkout, or "
            f"`{pip_install(f'tracedb[{extra}]')}` where tracedb was installed with pip")
