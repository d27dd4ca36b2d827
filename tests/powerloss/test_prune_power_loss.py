"""Power cuts right after prune returned: what it deleted stays deleted.

Prune's walk and its vacuum commit without an fsync each (retention._WALK_PRAGMAS), and prune
makes them durable before it returns: the truncating checkpoint syncs what it copies, and when a
reader's snapshot holds the checkpoint back, prune syncs SQLite's WAL file itself. Each case here
is the second path: prune runs in a child process on the lazy file system while another
connection holds a read transaction open, exits without closing anything, the power is cut losing
every write not synced, and the test reads what the disk kept; once with nothing for the vacuum
to do, once with pages vacuumed. (Both fail without that fsync.) The first path runs in the
power-loss scenarios of test_power_loss.py, where prune runs next to a recorder.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from . import harness

DAY_NS = 86_400 * 10**9
RECENT = 40

PRUNE_HOLDING_A_READER = r"""
import json, sqlite3, sys, os
from tracedb.projection import db
from tracedb.maintenance.retention import prune

path, now_ns = sys.argv[1], int(sys.argv[2])
reader = sqlite3.connect(path, isolation_level=None)
reader.execute("BEGIN")
reader.execute("SELECT count(*) FROM traces").fetchone()  # a snapshot from before the prune
engine = db.create_engine(path, write=True)
res = prune(engine, 30 * 86400, now_ns=now_ns)
wal_left = os.path.getsize(path + "-wal")  # the reader held the checkpoint back: not empty
print(json.dumps({"deleted": res.deleted_traces, "steps": res.deleted_steps, "wal_left": wal_left}), flush=True)
os._exit(0)  # nothing closed: no checkpoint on the way out
"""


def _record(path: str, executions: int, events: int, payload_bytes: int) -> int:
    """A store of `executions` executions 40 days old at `now` and 40 recent ones after them,
    small enough to share pages with the old ones; returns now (ns)."""
    import tracedb

    now = time.time_ns()
    clock = [now - 40 * DAY_NS]
    with tracedb.open(path, clock=lambda: clock[0]) as store:
        for i in range(executions):
            ex = store.start("Old", {"i": i})
            for k in range(events):
                ex.event("tool.responded", {"k": k, "text": "x" * payload_bytes})
            ex.finish({"status": "success"})
        clock[0] = now
        for i in range(RECENT):
            store.start("Recent", {"i": i}).finish({"status": "success"})
    return now


@pytest.mark.parametrize(
    "executions, events, payload_bytes",
    [(1, 1, 10), (300, 20, 400)],
    ids=["nothing-to-vacuum", "pages-vacuumed"],
)
def test_what_prune_deleted_before_it_returned_survives_a_power_cut(lazy_root, executions, events, payload_bytes):
    source = os.path.join(lazy_root, "prepared")
    now = _record(source, executions, events, payload_bytes)
    shutil.copytree(source, os.path.join(lazy_root, "backing", "data"))
    mount = harness.LazyMount(lazy_root)
    try:
        db_path = os.path.join(mount.mnt, "data", "traces.db")
        r = subprocess.run([sys.executable, "-c", PRUNE_HOLDING_A_READER, db_path, str(now)], cwd=harness.ROOT,
                           env=harness.env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        done = json.loads(r.stdout)
        assert done["deleted"] == executions and done["steps"] == executions * (events + 1)
        assert done["wal_left"] > 0
        mount.cut("right after prune returned")
        mount.apply("worst", 1)
        mount.unmount()
    finally:
        mount.close()
    kept = sqlite3.connect(os.path.join(lazy_root, "backing", "data", "traces.db"))
    try:
        assert kept.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert kept.execute("SELECT intent, count(*) FROM traces GROUP BY intent").fetchall() == [("Recent", RECENT)]
        assert kept.execute("SELECT count(*) FROM trace_steps").fetchone()[0] == RECENT
        free = kept.execute("PRAGMA freelist_count").fetchone()[0]
        assert free == 0, f"{free} free pages left: prune's vacuum did not reach the disk"
    finally:
        kept.close()
