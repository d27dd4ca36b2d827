"""Real processes: a writer SIGKILLed at random moments, and the lock across processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

import wal
from helpers import read_all

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "wal_kill_writer.py"
ROOT = HERE.parent.parent

from wal_kill_writer import payload  # noqa: E402


def _env() -> dict:
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )


def _run_and_kill(directory: str, round_no: int, kill_after: int, engine: str) -> list[tuple[int, str]]:
    """Start a writer, SIGKILL it once it has acknowledged `kill_after` records; return every
    acknowledgement it printed."""
    proc = _spawn("append", directory, str(round_no), "3", "3", engine)
    watchdog = threading.Timer(20, proc.kill)  # a hung writer fails the test instead of hanging it
    watchdog.start()
    try:
        lines = []
        while len(lines) < kill_after:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=20)
    finally:
        watchdog.cancel()
    assert proc.returncode == -signal.SIGKILL, f"the writer died on its own: {err.decode()[-2000:]}"
    assert len(lines) >= kill_after, "the writer stopped acknowledging"
    acks = []
    for line in lines + rest.splitlines(keepends=True):
        if line.endswith(b"\n"):  # a line cut by the kill was never fully printed
            lsn, record_id = line.split()
            acks.append((int(lsn), record_id.decode()))
    return acks


@pytest.mark.parametrize("engine", ["loop", "thread"])
def test_a_sigkilled_writer_loses_no_acknowledged_record(tmp_path, engine):
    """Threads and asyncio tasks append; the tasks' event loop flushes (attached) or the
    flusher thread does everything. 4 KiB segments: rotations all the time."""
    directory = str(tmp_path / "wal")
    rng = random.Random(0xC0FFEE)
    acknowledged: dict[int, str] = {}
    for round_no in range(10):
        acks = _run_and_kill(directory, round_no, kill_after=rng.randint(1, 1500), engine=engine)
        for lsn, record_id in acks:
            assert acknowledged.setdefault(lsn, record_id) == record_id, f"LSN {lsn} acked twice"
        records = read_all(directory)
        lsns = [r.lsn for r in records]
        assert lsns == list(range(1, len(lsns) + 1)), "records are in LSN order without gaps"
        ids = [r.payload.split(b"|", 1)[0].decode() for r in records]
        for r, record_id in zip(records, ids):
            assert r.payload == payload(record_id), f"LSN {r.lsn} has a damaged payload"
        dupes = [x for x, n in Counter(ids).items() if n > 1]
        assert not dupes, f"records present twice: {dupes[:5]}"
        by_lsn = dict(zip(lsns, ids))
        for lsn, record_id in acknowledged.items():
            assert by_lsn.get(lsn) == record_id, f"acknowledged LSN {lsn} ({record_id}) lost"
    assert len(acknowledged) >= 10
    with wal.Wal(directory) as w:
        assert w.append(b"after the kills") == w.open_result.last_lsn + 1


def test_a_second_writer_in_another_process_gets_locked_error_naming_the_holder_pid(tmp_path):
    directory = str(tmp_path / "wal")
    proc = _spawn("hold", directory)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("ready"), proc.stderr.read().decode()
        with pytest.raises(wal.WalLockedError) as e:
            wal.Wal(directory)
        assert f"pid={proc.pid}" in e.value.holder
        assert f"pid={proc.pid}" in str(e.value)
        with pytest.raises(wal.WalLockedError):
            wal.repair(directory)
    finally:
        _out, err = proc.communicate(timeout=20)  # closes stdin: the holder exits
    assert proc.returncode == 0, err.decode()
    with wal.Wal(directory) as w:
        assert w.append(b"the lock was released") == 1
