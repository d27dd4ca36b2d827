"""Fixtures for the damage tests: a recorder process to SIGKILL, the CLI, byte-editing helpers."""

from __future__ import annotations

import os
import re
import shlex

import orjson
import pytest
from click.testing import CliRunner

import wal
from tests.children import Child
from tests.other_user import nobody  # noqa: F401 - the fixture, for the tests of this folder
from tracedb.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))


class Recorder(Child):
    """A real recorder process (recorder.py), killed with SIGKILL once it said READY."""

    def __init__(self, data_dir: str, *args, env: dict | None = None, pause: str | None = None):
        """`pause`, "<point>:<batch>": the compactor stops there and says PAUSED (pause_launcher)."""
        super().__init__(os.path.join(HERE, "recorder.py"), data_dir, *args, env=env, pause=pause, stderr=False)

    def ready(self, word: str = "READY") -> int:
        """Wait for the line starting with `word` (READY: the durable LSN it reports)."""
        line = self.wait_for(word)
        return int(line.split()[1]) if word == "READY" else 0


@pytest.fixture
def recorded(tmp_path):
    """recorded(*scenario) -> (data_dir, durable LSN): a recorder ran the scenario and was SIGKILLed."""
    procs = []

    def _run(*args):
        d = str(tmp_path / f"data{len(procs)}")
        r = Recorder(d, *args)
        procs.append(r)
        lsn = r.ready()
        r.kill()
        return d, lsn

    yield _run
    for r in procs:
        if r.proc.poll() is None:
            r.kill()


class Cli:
    """The tracedb command line on one data directory; `json(...)` parses stdout."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.runner = CliRunner()

    def __call__(self, *args):
        return self.runner.invoke(main, ["--data-dir", self.data_dir, *args], catch_exceptions=False)

    def json(self, *args, code: int = 0):
        r = self(*args)
        assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
        return orjson.loads(r.stdout)


@pytest.fixture
def cli():
    return Cli


def hinted_commands(text: str) -> list[str]:
    """The `tracedb ...` commands a hint names, in order."""
    return re.findall(r"`(tracedb [^`]+)`", text)


def follow(run: Cli, command: str):
    """Run a `tracedb ...` command a hint named, through `run` (a Cli on the data directory)."""
    args = shlex.split(command)
    assert args[0] == "tracedb"
    return run(*args[1:])


def flip_bit(path: str, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))


def wal_records(wal_dir: str) -> list:
    """(lsn, segment name, offset, length in bytes) of every record, read before any damage."""
    out = []
    for rec in wal.read_records(wal_dir):
        out.append((rec.lsn, rec.segment, rec.offset, 20 + len(rec.payload) + (-(20 + len(rec.payload)) % 8)))
    return out
