"""Run tracedb as another local user, `nobody`, in a process of its own: for what permissions
refuse. Root does not feel chmod, so a test of a refusal needs another user.

    # conftest.py: the fixture; it skips, saying why, where no process can start as `nobody`
    from tests.other_user import nobody  # noqa: F401

    def test_x(nobody):
        r = nobody.tracedb("--data-dir", d, "inspect", "--list")
        assert r.returncode == 1 and r.stderr.startswith("error: ")

Starting a process as `nobody` takes root (runuser) and an interpreter `nobody` may run: this
one when it may (a virtualenv made from a Python under /root is not), else the system's Python
of the same version, with this one's site-packages. Files the user must reach go under
`nobody.tmpdir()` (pytest's tmp_path is private to root).
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
from typing import Iterator, Optional

import pytest

USER = "nobody"
_CLI = "from tracedb.cli import main\nmain(prog_name='tracedb')"


@functools.lru_cache(maxsize=None)
def _interpreter() -> Optional[str]:
    """A Python of this version that USER may run, or None."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    seen = []
    for candidate in (sys.executable, os.path.realpath(sys.executable), f"/usr/bin/python{version}",
                      f"/usr/local/bin/python{version}"):
        if candidate in seen or not os.path.exists(candidate):
            continue
        seen.append(candidate)
        r = subprocess.run(
            ["runuser", "-u", USER, "--", candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60,
        )
        if r.returncode == 0 and r.stdout.strip() == version:
            return candidate
    return None


def skip_reason() -> Optional[str]:
    """Why tests cannot run as USER here, or None when they can."""
    if os.geteuid() != 0:
        return f"needs root, to start a process as {USER} (runuser); as the owner, chmod refuses no one"
    if shutil.which("runuser") is None:
        return "needs runuser (util-linux) to start a process as another user"
    if _interpreter() is None:
        return (f"no Python {sys.version_info[0]}.{sys.version_info[1]} that {USER} may run (this one is "
                f"{os.path.realpath(sys.executable)}, in a directory {USER} cannot enter)")
    return None


class OtherUser:
    """Runs code and tracedb commands as USER; made by the `nobody` fixture."""

    name = USER

    def __init__(self) -> None:
        self._dirs: list[str] = []
        # This interpreter's packages (tracedb's editable install among them) for the other one.
        paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
        self._prelude = f"import site, sys\nfor p in {paths!r}: site.addsitedir(p)\n"

    def tmpdir(self) -> str:
        """A new directory USER can reach (its parents are /tmp's), removed after the test."""
        d = tempfile.mkdtemp(prefix="tracedb-other-user-")
        os.chmod(d, 0o755)
        self._dirs.append(d)
        return d

    def python(self, code: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """`code` run as USER by `python -c` (sys.argv[1:] = `args`), in a new process."""
        return subprocess.run(
            ["runuser", "-u", USER, "--", _interpreter(), "-c", self._prelude + code, *args],
            capture_output=True, text=True, timeout=timeout_s, cwd="/",
        )

    def tracedb(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """`tracedb ARGS...` run as USER."""
        return self.python(_CLI, *args, timeout_s=timeout_s)

    def start_tracedb(self, *args: str) -> subprocess.Popen:
        """`tracedb ARGS...` started as USER (text pipes); the caller stops it."""
        return subprocess.Popen(
            ["runuser", "-u", USER, "--", _interpreter(), "-c", self._prelude + _CLI, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        )

    def give(self, path: str) -> None:
        """Make USER the owner of `path` and of everything under it."""
        subprocess.run(["chown", "-R", USER, path], check=True)

    def cleanup(self) -> None:
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def nobody() -> Iterator[OtherUser]:
    """An OtherUser; the test skips, saying why, where no process can be started as USER."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    user = OtherUser()
    try:
        yield user
    finally:
        user.cleanup()
