"""The compactor in a process of its own, for the recorder.

In one process, the compactor's CPU (reading and checking WAL records, building rows, SQLite's
own work while it holds the GIL) comes out of the interpreter that acknowledges events. A child
process runs the same `Compactor` on the same files instead, on the machine's other core.

The parent keeps every decision: it says how far the log is durable (`compact <lsn>`), the child
applies up to there and answers with what it applied; the parent then deletes WAL segments
(`mark_applied`) and forgets closed executions, as it does after an in-process compaction. The
child never reads past the LSN it is given, and the applied LSN still commits with the rows, so a
crash of either process neither loses nor duplicates a step.

Wire, one line at a time: the parent first sends the settings (JSON: the database URL may hold a
password, so never on the command line), the child answers `ready <applied_lsn>`. The recorder
starts it without holding its compaction lock and may compact in-process meanwhile, so the child
reads the checkpoint again at its first `compact`, sent under that lock. For each
`compact <lsn>` the child sends `progress <lsn>` after each batch and ends with `ok <CompactResult
as JSON>` or `error <{"type", "message"} as JSON>`. End of input: the child exits.

A child silent for `STALL_S` (no batch finished: a hung database call) is killed and the recorder
compacts in-process; so is one that exits. The child runs in its own session (a Ctrl-C in the
recorder's terminal is the recorder's to handle) and, on Linux, dies with the recorder thread
that started it: the store starts it from its long-lived background thread.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time

from tracedb.projection import db
from tracedb.projection.compactor import CompactResult, Compactor
from tracedb.errors import TraceDBError, WorkerGoneError  # WorkerGoneError: re-exported (its old home)


STALL_S = 120.0


def interpreter_runs_python() -> bool:
    """Whether `sys.executable` is a Python interpreter this process can start the child with.

    Not so in a frozen application (PyInstaller: it is the application itself) or under an
    embedding server (uWSGI, mod_wsgi: the server's binary). `[compaction] worker_process =
    "auto"` then keeps compacting in-process; `true` tries anyway (and falls back if the child
    never says it is ready)."""
    if getattr(sys, "frozen", False) or not sys.executable:
        return False
    name = os.path.basename(sys.executable).lower()
    return name.startswith(("python", "pypy")) and os.access(sys.executable, os.X_OK)


class CompactorWorker:
    """Parent side: starts the child and asks it to compact. Not thread-safe (the store's
    compaction lock serialises calls)."""

    def __init__(self, *, database: str, wal_dir: str, recorder_id: str, batch_records: int,
                 busy_timeout_ms: int):
        spec = json.dumps({
            "database": database, "wal_dir": wal_dir, "recorder_id": recorder_id,
            "batch_records": batch_records, "busy_timeout_ms": busy_timeout_ms,
            "parent_pid": os.getpid(),
        })
        self._buf = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracedb.projection.compactor_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, start_new_session=True,
        )
        try:
            self._send(spec)
            first = self._read_line()
            if not first.startswith("ready "):
                raise WorkerGoneError(f"the compactor process did not start: {first!r}")
        except BaseException:
            self.close(timeout_s=5.0)
            raise
        self.applied_lsn = int(first.split()[1])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerGoneError(f"the compactor process {self.proc.pid} is gone: {e}") from None

    def _read_line(self) -> str:
        # Our own line buffer over the raw pipe: select() must see every byte not yet consumed,
        # which a buffered reader's read-ahead would hide. A deadline per line: each batch the
        # child finishes says so, so only a child stuck on one batch for STALL_S is given up on.
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], STALL_S)
            if not ready:
                self.proc.kill()
                raise WorkerGoneError(
                    f"the compactor process {self.proc.pid} finished no batch in {STALL_S:.0f} s; killed"
                )
            chunk = os.read(fd, 65536)
            if not chunk:
                try:  # its output ended: it is exiting, or has
                    status = self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    status = "unknown: still running"
                raise WorkerGoneError(f"the compactor process {self.proc.pid} exited (status {status})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def compact(self, to_lsn: int) -> CompactResult:
        """Apply every record up to the durable `to_lsn`; returns what the child applied."""
        self._send(f"compact {int(to_lsn)}")
        line = self._read_line()
        while line.startswith("progress "):
            line = self._read_line()
        kind, _, body = line.partition(" ")
        if kind == "ok":
            result = CompactResult(**json.loads(body))
            self.applied_lsn = result.applied_lsn
            return result
        if kind == "error":
            err = json.loads(body)
            raise TraceDBError(f"compaction failed in the compactor process: {err['type']}: {err['message']}")
        raise WorkerGoneError(f"the compactor process answered {line!r}")

    def close(self, timeout_s: float = 30.0) -> None:
        """End of input: the child finishes the batch it is in and exits."""
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def _die_with_parent(parent_pid: int) -> None:
    # Linux: SIGKILL this process when the recorder dies, so that a new recorder never finds an
    # old compactor still at work (the checkpoint's compare-and-set would catch it anyway).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the recorder died before prctl took effect
        os._exit(1)


def main() -> int:
    """Child side: compact on request until standard input ends."""
    spec = json.loads(sys.stdin.buffer.readline())
    _die_with_parent(spec["parent_pid"])
    engine = db.create_engine(spec["database"], busy_timeout_ms=spec["busy_timeout_ms"], write=True)
    applied = db.ensure_checkpoint(engine, spec["recorder_id"], time.time_ns())
    comp = Compactor(engine, spec["wal_dir"], spec["recorder_id"], applied,
                     batch_records=spec["batch_records"])
    out = sys.stdout.buffer
    out.write(f"ready {applied}\n".encode())
    out.flush()
    first = True
    try:
        for line in sys.stdin.buffer:
            cmd, _, arg = line.decode().strip().partition(" ")
            if cmd != "compact":
                continue
            if first:
                # The recorder may have compacted in-process while this process started: the
                # checkpoint as of its first request (sent under its compaction lock) is where
                # this process takes over.
                first = False
                stored = db.ensure_checkpoint(engine, spec["recorder_id"], time.time_ns())
                if stored > comp.applied_lsn:
                    comp.adopt(stored)
            def progress(applied: int) -> None:
                out.write(f"progress {applied}\n".encode())
                out.flush()

            try:
                result = comp.compact(int(arg), on_batch=progress)
                reply = "ok " + json.dumps(dataclasses.asdict(result))
            except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
                reply = "error " + json.dumps({"type": type(e).__name__, "message": str(e)})
            out.write(reply.encode() + b"\n")
            out.flush()
    finally:
        comp.close()
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
