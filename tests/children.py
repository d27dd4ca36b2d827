"""A test's own Python script as a real process that speaks in lines on stdout (READY, PAUSED,
RECORDED ...), for the tests that SIGKILL a recorder at a known point: this checkout's tracedb
on its path, optionally under the compaction pause hook (tests/pause_launcher.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TypeVar

from tests import pause_launcher
from tests.conftest import REPO

P = TypeVar("P")


def say(line: str) -> None:
    """The child's side: one line on stdout, flushed at once (what `Child.wait_for` reads)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Child:
    """`python SCRIPT ARGS`; `pause`, "<point>:<batch>": the compactor stops there and says
    PAUSED. `stderr`: its stderr piped (read when it dies early), else the test's own."""

    def __init__(self, script: str, *args: str, env: Optional[dict] = None, pause: Optional[str] = None,
                 stderr: bool = True):
        full_env = dict(os.environ, **(env or {}))
        full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
        argv = [script, *map(str, args)]
        self.proc = subprocess.Popen(
            pause_launcher.command(pause, *argv) if pause else [sys.executable, *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE if stderr else None,
            cwd=REPO, env=full_env, text=True,
        )

    def wait_for(self, word: str) -> str:
        """The first stdout line starting with `word` (earlier ones skipped; a blocking read, no
        sleep); AssertionError with what it said if it exits first."""
        seen = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"{self.proc.args} exited ({self.proc.wait()}) before {word!r}: {seen} {err}")
            seen.append(line.strip())
            if line.startswith(word):
                return line.strip()

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Wait for a clean exit; AssertionError with its stderr otherwise."""
        code = self.proc.wait()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        self._close_pipes()
        assert code == 0, err

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f and not f.closed:
                f.close()


def kill_when(proc: subprocess.Popen, ready: Callable[[], object]) -> None:
    """SIGKILL `proc` (a crash) once `ready()`, which waits for the point to kill it at, returned;
    `proc` is reaped whatever happens."""
    try:
        ready()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextmanager
def killed_after(start: Callable[..., P]) -> Iterator[Callable[..., P]]:
    """`start`, a factory of processes (each with a `kill()`: SIGKILL and reap), with every process
    it started killed when the block ends: the teardown of a fixture that starts them."""
    started: list = []

    def tracked(*args, **kwargs) -> P:
        p = start(*args, **kwargs)
        started.append(p)
        return p

    try:
        yield tracked
    finally:
        for p in started:
            p.kill()
