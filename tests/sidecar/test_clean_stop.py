"""A clean stop leaves traces.db whole on its own, whatever read it: after SIGTERM the -wal is
gone or empty, and a copy of the .db file alone holds the tables and every row. Readers keep
their connections open (the web view of `serve --http-port`, a `tracedb ui` process next to
the recorder); SQLite's own checkpoint at the last close does not happen while one is open.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from tracedb.sidecar.client import Client

from tests.serving import ROOT
from .helpers import free_port, wait_for

pytestmark = pytest.mark.timeout(300)

ENV = {"intent": "ProcessIntent", "payload": {"n": 1}}
N = 30


def _record(socket_path: str, n: int = N) -> list[str]:
    ids = []
    with Client(socket_path) as client:
        for i in range(n):
            ex = client.start("ProcessIntent", ENV)
            ex.event("tool.requested", {"name": "search", "i": i, "pad": "x" * 200})
            ex.event("tool.responded", {"name": "search", "result": "y" * 200})
            ex.finish({"status": "success", "payload": {"i": i}})
            ids.append(ex.execution_id)
    return ids


def _assert_self_contained(data_dir: str, tmp_path, ids: list[str]) -> None:
    """The -wal is absent or empty, and the .db copied alone has the tables and the rows."""
    db = os.path.join(data_dir, "traces.db")
    wal_file = db + "-wal"
    assert not os.path.exists(wal_file) or os.path.getsize(wal_file) == 0, os.path.getsize(wal_file)
    alone = tmp_path / "alone"
    alone.mkdir(parents=True)
    shutil.copy(db, alone / "traces.db")
    conn = sqlite3.connect(str(alone / "traces.db"))
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"traces", "trace_steps", "compaction_checkpoint"} <= tables, tables
        stored = {r[0]: r[1] for r in conn.execute("SELECT execution_id, status FROM traces")}
        assert set(ids) <= set(stored) and {stored[i] for i in ids} == {"completed"}
        steps = conn.execute("SELECT count(*) FROM trace_steps WHERE execution_id IN (%s)"
                             % ",".join("?" * len(ids)), ids).fetchone()[0]
        assert steps == 3 * len(ids)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def _bearer(data_dir: str) -> dict:
    """The header that carries the token the listeners take (the data directory's file)."""
    with open(os.path.join(data_dir, "token"), encoding="utf-8") as f:
        return {"Authorization": "Bearer " + f.read().strip()}


def _served(base: str, ids: list[str], data_dir: str) -> None:
    """The web view answered requests that read the store: the list, and an execution's page."""
    auth = _bearer(data_dir)
    wait_for(lambda: ids[-1] in httpx.get(base + "/", headers=auth, timeout=10).text, 60,
             "the list to show the last execution")
    page = httpx.get(f"{base}/e/{ids[0]}", headers=auth, timeout=10)
    assert page.status_code == 200 and ids[0] in page.text


def test_sigterm_after_web_view_requests_leaves_a_self_contained_database(serve_process, tdir, tmp_path):
    port = free_port()
    rec = serve_process("--http-port", str(port))
    ids = _record(rec.socket)
    _served(f"http://127.0.0.1:{port}", ids, tdir)
    code, err = rec.terminate()
    assert code == 0, err[-3000:]
    _assert_self_contained(tdir, tmp_path, ids)


class UiProcess:
    """`tracedb ui --port 0 --json` on a data directory, in a process of its own."""

    def __init__(self, data_dir: str, env: dict | None = None):
        full_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "ui", "--port", "0", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
        )
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        self.url = orjson.loads(line)["url"].split("?", 1)[0].rstrip("/")  # without its ?token=

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()


def test_a_recorder_stopped_while_tracedb_ui_reads_leaves_a_self_contained_database(serve_process, tdir, tmp_path):
    rec = serve_process()
    ids = _record(rec.socket)
    ui = UiProcess(tdir)
    try:
        _served(ui.url, ids, tdir)
        code, err = rec.terminate()
        assert code == 0, err[-3000:]
        _assert_self_contained(tdir, tmp_path, ids)
        # The view reads on, with no recorder: the same rows, from the database file.
        assert ids[-1] in httpx.get(ui.url + "/", headers=_bearer(tdir), timeout=10).text
    finally:
        assert ui.stop() == 0
    _assert_self_contained(tdir, tmp_path / "after-ui", ids)


def test_tracedb_ui_stopping_next_to_a_live_recorder_never_waits_for_its_write_lock(serve_process, tdir):
    # A checkpoint that truncates the log (or restarts it) waits for the writer: a view that
    # did one at its stop would hold up the recorder's compaction, or wait out its busy timeout.
    # Here a writer holds the database's write lock, as the compactor does while it writes a
    # batch, and the view, given a 60 s busy timeout, must stop at once all the same.
    rec = serve_process()
    ids = _record(rec.socket, 5)
    ui = UiProcess(tdir, env={"TRACEDB_BUSY_TIMEOUT_MS": "60000"})
    writer = sqlite3.connect(os.path.join(tdir, "traces.db"), isolation_level=None, timeout=30)
    try:
        _served(ui.url, ids, tdir)
        writer.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert ui.stop(timeout_s=30) == 0
        assert time.monotonic() - started < 15
    finally:
        if writer.in_transaction:
            writer.execute("ROLLBACK")
        writer.close()
        if ui.proc.poll() is None:
            ui.proc.kill()
    more = _record(rec.socket, 3)  # the recorder goes on
    code, err = rec.terminate()
    assert code == 0, err[-3000:]
    conn = sqlite3.connect(os.path.join(tdir, "traces.db"))
    try:
        assert conn.execute("SELECT count(*) FROM traces").fetchone()[0] == len(ids + more)
    finally:
        conn.close()
