"""Retention: what prune deletes and keeps, dry runs, idempotence, space, next to a recorder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa

from tests.conftest import REPO
from tracedb.maintenance import retention
from tracedb.projection.models import trace_steps, traces

from .conftest import record_seed_002
from .streaming_scenarios import forks_without_parent, record, record_retention_store, stored_ids

DAY = 86400


def step_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(trace_steps)).scalar()


def test_prune_deletes_old_terminal_traces_and_keeps_the_rest(open_store, clock):
    store = open_store()
    old_done = record_seed_002(store, "exec-old-done")
    old_cut = store.start("X", {}, "exec-old-incomplete")
    old_cut.event("tool.requested", {})
    store.staging.mark_incomplete(store.staging.open_states(), "test")
    old_running = store.start("X", {}, "exec-old-running")
    old_pinned = record_seed_002(store, "exec-old-pinned")
    parent = record_seed_002(store, "exec-old-parent")
    clock.advance(31 * DAY)
    fork = store.start("X", {}, "exec-fork", parent_execution_id=parent.execution_id, forked_at_seq=3)
    young = record_seed_002(store, "exec-young")
    store.pin(old_pinned.execution_id)
    clock.advance(1)

    dry = store.prune(older_than_s=30 * DAY, dry_run=True)
    assert (dry.dry_run, dry.deleted_traces, dry.deleted_steps) == (True, 2, 9)
    assert (dry.kept_pinned, dry.kept_parents) == (1, 1)
    assert len(store.list()) == 7  # a dry run deletes nothing

    result = store.prune(older_than_s=30 * DAY)
    assert (result.deleted_traces, result.deleted_steps) == (2, 9)
    assert (result.kept_pinned, result.kept_parents) == (1, 1)
    left = {r.execution_id for r in store.list()}
    assert left == {
        old_running.execution_id, old_pinned.execution_id, parent.execution_id,
        fork.execution_id, young.execution_id,
    }
    assert old_done.execution_id not in left and old_cut.execution_id not in left
    # Idempotent.
    again = store.prune(older_than_s=30 * DAY)
    assert (again.deleted_traces, again.deleted_steps) == (0, 0)
    # Unpinned, it goes next time; the running one never does.
    store.unpin(old_pinned.execution_id)
    assert store.prune(older_than_s=30 * DAY).deleted_traces == 1
    assert store.verify().ok


def test_a_parent_goes_in_the_same_run_as_its_last_fork(open_store, clock):
    store = open_store()
    parent = record_seed_002(store, "exec-parent")
    fork = store.start("X", {}, "exec-fork", parent_execution_id=parent.execution_id, forked_at_seq=2)
    fork.finish({"status": "success"})
    clock.advance(40 * DAY)
    dry = store.prune(older_than_s=30 * DAY, dry_run=True)
    result = store.prune(older_than_s=30 * DAY)
    assert dry.deleted_traces == result.deleted_traces == 2
    assert store.list() == []


def test_prune_works_in_batches_and_gives_space_back(open_store, clock):
    store = open_store(prune_batch_traces=7)
    for i in range(40):
        ex = store.start("X", {"i": i})
        for j in range(20):
            ex.event("tool.requested", {"blob": "z" * 500, "j": j})
        ex.finish({"status": "success"})
    store.compact()
    clock.advance(31 * DAY)
    db_path = store.config.sqlite_path
    result = store.prune()  # default: retention_days (30)
    assert result.deleted_traces == 40 and result.deleted_steps == 40 * 21
    assert result.batches == 6
    assert result.bytes_freed > 40 * 20 * 500
    assert step_count(store.engine) == 0
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA freelist_count").scalar() == 0
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    assert os.path.getsize(db_path + "-wal") == 0


def test_prune_gives_its_connection_back_with_sqlites_settings(open_store, clock):
    # The walk checkpoints less often, commits without fsync and zeroes less; the connection the
    # recorder's compactor takes from the pool next must run as before, whether prune deleted,
    # or failed half-way.
    import sqlite3

    names = [name for name, _ in retention._WALK_PRAGMAS]
    assert names == ["wal_autocheckpoint", "secure_delete", "synchronous"]
    plain = sqlite3.connect(":memory:")
    # This build's secure_delete default, whatever it is; the store's own synchronous (FULL).
    default = (1000, plain.execute("PRAGMA secure_delete").fetchone()[0], 2)
    plain.close()
    store = _store_of_old_executions(open_store, clock, 5)
    seen = []

    def progress(done, total):
        with store.engine.connect() as other:  # the pool's other connection, not the walk's
            seen.append(_walk_settings(other.connection.driver_connection))
        if done >= 4:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        store.prune(older_than_s=30 * DAY, progress=progress)
    assert seen and set(seen) == {default}
    assert store.prune(older_than_s=30 * DAY).deleted_traces == 1
    # Every connection the pool holds, the walk's among them, held at once (read outside a
    # transaction: the engine's BEGIN IMMEDIATE would make them wait for each other).
    conns = [store.engine.connect() for _ in range(store.engine.pool.size() + 2)]
    try:
        assert [_walk_settings(c.connection.driver_connection) for c in conns] == [default] * len(conns)
    finally:
        for c in conns:
            c.close()


def _store_of_old_executions(open_store, clock, n: int):
    """A store pruning two traces a batch, holding `n` executions 31 days old."""
    store = open_store(prune_batch_traces=2)
    for i in range(n):
        record(store, clock, f"exec-old{i}")
    store.compact()
    clock.advance(31 * DAY)
    return store


def _walk_settings(raw) -> tuple:
    """A SQLite connection's values of the settings prune's walk changes (`_WALK_PRAGMAS`)."""
    return tuple(raw.execute(f"PRAGMA {name}").fetchone()[0] for name, _ in retention._WALK_PRAGMAS)


def test_the_walk_runs_with_its_own_settings(open_store, clock):
    store = _store_of_old_executions(open_store, clock, 3)
    during = []
    real = retention._run_batch

    def watching(conn, *a, **k):
        during.append(_walk_settings(conn.connection.driver_connection))
        return real(conn, *a, **k)

    import unittest.mock

    with unittest.mock.patch.object(retention, "_run_batch", watching):
        assert store.prune(older_than_s=30 * DAY).deleted_traces == 3
    # 16,384 pages between checkpoints, secure_delete FAST (2), synchronous NORMAL (1).
    assert set(during) == {(retention.PRUNE_WAL_AUTOCHECKPOINT_PAGES, 2, 1)}


def test_cli_prune_runs_next_to_a_live_recorder(open_store, clock, data_dir):
    store = open_store()
    record_seed_002(store, "exec-old")
    live = store.start("X", {}, "exec-live")
    live.event("tool.requested", {})
    store.compact()
    env = dict(os.environ, PYTHONPATH=REPO)
    # The fake clock is 2024; the CLI's real clock makes everything old enough.
    out = subprocess.run(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "prune", "--older-than", "1d", "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert '"deleted_traces":1' in out.stdout
    # The recorder goes on recording and compacting.
    assert live.event("tool.requested", {}) == 2
    assert [r.execution_id for r in store.list()] == ["exec-live"]
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(traces)).scalar() == 1


# --- prune walks the old traces in batches ------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2, 3, 7, 500])
def test_batches_of_any_size_keep_pins_and_fork_parents_and_dry_run_counts_the_same(open_store, clock, batch):
    store = open_store(prune_batch_traces=batch)
    want = record_retention_store(store, clock)
    counts = (len(want["deleted"]), want["deleted_steps"], want["kept_pinned"], want["kept_parents"])

    dry = store.prune(older_than_s=30 * DAY, dry_run=True)
    assert (dry.deleted_traces, dry.deleted_steps, dry.kept_pinned, dry.kept_parents) == counts
    assert stored_ids(store.engine) == want["kept"] | want["deleted"]  # nothing deleted

    orphaned = []

    def progress(done, total):
        # Called between batches: no fork may have lost its parent while its turn has not come.
        assert done <= total
        orphaned.extend(forks_without_parent(store.engine))

    result = store.prune(older_than_s=30 * DAY, progress=progress)
    assert (result.deleted_traces, result.deleted_steps, result.kept_pinned, result.kept_parents) == counts
    assert stored_ids(store.engine) == want["kept"]
    assert orphaned == []
    if batch < len(want["deleted"]):
        assert result.batches > 1
    assert store.verify().ok
    again = store.prune(older_than_s=30 * DAY)
    assert (again.deleted_traces, again.kept_pinned, again.kept_parents) == (0, 4, 5)


def test_a_fork_started_after_the_dry_run_keeps_its_parent(open_store, clock):
    # Each batch decides in its own transaction: the real run sees the fork the dry run did not.
    store = open_store(prune_batch_traces=2)
    for i in range(6):
        record(store, clock, f"exec-old{i}")
    clock.advance(31 * DAY)
    store.compact()
    assert store.prune(older_than_s=30 * DAY, dry_run=True).deleted_traces == 6
    record(store, clock, "exec-new-fork", parent_execution_id="exec-old0", forked_at_seq=1)
    store.compact()
    result = store.prune(older_than_s=30 * DAY)
    assert (result.deleted_traces, result.kept_parents) == (5, 1)
    assert stored_ids(store.engine) == {"exec-old0", "exec-new-fork"}



def test_prune_keeps_the_parents_of_forks_acknowledged_but_not_compacted(open_store, clock, data_dir):
    # The recorder runs with its compaction window open: the forks are acknowledged (in the WAL),
    # not in the database yet, when `tracedb prune` runs in another process.
    store = open_store()
    record_seed_002(store, "exec-old")
    middle = store.start("X", {}, "exec-fork1", parent_execution_id="exec-old", forked_at_seq=2)
    middle.finish({"status": "success"})
    record_seed_002(store, "exec-other")
    store.compact()
    store.start("X", {}, "exec-fork2", parent_execution_id="exec-fork1", forked_at_seq=1)
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "prune", "--older-than", "1d", "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # exec-fork2's parent and grandparent stay; only the unrelated old trace goes.
    assert (result["deleted_traces"], result["kept_parents"]) == (1, 2), result
    store.compact()
    assert stored_ids(store.engine) == {"exec-old", "exec-fork1", "exec-fork2"}
    assert forks_without_parent(store.engine) == []


def test_a_reader_holding_a_snapshot_holds_prunes_closing_checkpoint_back_only_briefly(open_store, clock):
    """The truncating checkpoint holds every writer off while it waits for readers: prune lets
    it wait CHECKPOINT_WAIT_MS, not the store's busy timeout (5 s), and the WAL is cut by the
    next prune once the reader is gone."""
    import sqlite3
    import time

    store = _store_of_old_executions(open_store, clock, 3)
    db_path = store.config.sqlite_path
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM traces").fetchone()
    try:
        t0 = time.monotonic()
        assert store.prune(older_than_s=30 * DAY).deleted_traces == 3
        waited = time.monotonic() - t0
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert waited < store.config.busy_timeout_ms / 1000 / 2, waited
    assert os.path.getsize(db_path + "-wal") > 0  # held back: not cut
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == store.config.busy_timeout_ms
    store.prune(older_than_s=30 * DAY)
    assert os.path.getsize(db_path + "-wal") == 0


@pytest.mark.parametrize("payload_bytes", [40, 6000], ids=["in-page", "overflow-pages"])
def test_no_pruned_row_is_left_in_the_database_files(open_store, clock, payload_bytes):
    """Old executions recorded between young ones, so that they share pages: after prune no
    byte of theirs is in the database file or SQLite's WAL file, whatever the build's
    secure_delete default (rows zeroed in the pages that keep them, free pages cut off or
    written over by the vacuum)."""
    store = open_store()
    marker = "PRUNED-SECRET-"
    for i in range(60):
        old = store.start("Old", {"i": i}, f"exec-old-{i:03d}")
        old.event("tool.responded", {"text": marker + "x" * payload_bytes})
        old.finish({"status": "success", "note": marker})
        clock.advance(1)
    clock.advance(31 * DAY)
    for i in range(60):
        young = store.start("Young", {"i": i})
        young.event("tool.responded", {"text": "kept " + "y" * payload_bytes})
        young.finish({"status": "success"})
    store.compact()
    path = store.config.sqlite_path

    def holding_marker() -> list:
        found = []
        for name in (path, path + "-wal"):
            if os.path.exists(name):
                with open(name, "rb") as f:
                    if marker.encode() in f.read():
                        found.append(os.path.basename(name))
        return found

    assert holding_marker()  # the test can see a row
    assert store.prune(older_than_s=30 * DAY).deleted_traces == 60
    assert holding_marker() == []
