"""Compaction: batches, idempotence, segment deletion, guards for operator changes."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

import tracedb
import wal
from tracedb.projection import db
from tracedb.maintenance import retention
from tracedb.projection.models import compaction_checkpoint, trace_steps, traces

from .conftest import assert_compaction_skips_a_pruned_trace, invalidated_in_the_database, record_seed_002


def counts(engine):
    with engine.connect() as conn:
        n_traces = conn.execute(sa.select(sa.func.count()).select_from(traces)).scalar()
        n_steps = conn.execute(sa.select(sa.func.count()).select_from(trace_steps)).scalar()
        applied = conn.execute(sa.select(compaction_checkpoint.c.applied_lsn)).scalar()
    return n_traces, n_steps, applied


def test_compaction_in_small_batches_applies_every_record_once(open_store):
    store = open_store(compact_batch_records=7)
    for i in range(20):
        ex = store.start("X", {"i": i})
        for j in range(9):
            ex.event("tool.requested", {"j": j})
        ex.finish({"status": "success"})
    result = store.compact()
    assert result.records == 20 * 11
    assert result.steps == 20 * 10
    assert result.batches == -(-220 // 7)
    assert result.applied_lsn == store.durable_lsn
    assert counts(store.engine) == (20, 200, store.durable_lsn)
    again = store.compact()
    assert again.records == 0
    assert counts(store.engine) == (20, 200, store.durable_lsn)
    assert store.verify().ok


def test_reopening_applies_nothing_twice(open_store):
    store = open_store()
    record_seed_002(store)
    store.compact()
    before = counts(store.engine)
    store.close()
    store = open_store()
    assert store.last_recovery.compacted_records == 0
    assert counts(store.engine) == before


def test_wal_segments_below_the_applied_lsn_are_deleted(open_store, data_dir):
    store = open_store(wal_segment_size_bytes=4096)
    for i in range(10):
        ex = store.start("X", {"pad": "x" * 300})
        for j in range(5):
            ex.event("tool.requested", {"pad": "y" * 300})
    wal_dir = os.path.join(data_dir, "wal")
    assert len(wal.list_segments(wal_dir)) > 3
    result = store.compact()
    assert result.segments_deleted > 0
    segs = wal.list_segments(wal_dir)
    assert len(segs) <= 2
    # What is left of the log still reads from the applied LSN on.
    assert wal.read_applied_lsn(wal_dir) <= store.applied_lsn + 1
    store.close()
    store = open_store(wal_segment_size_bytes=4096)
    assert len(store.list()) == 10
    assert store.verify().ok


def test_operator_invalidation_in_the_database_is_never_overwritten(open_store):
    store = open_store()
    ex = invalidated_in_the_database(store)
    ex.finish({"status": "success"})  # was in flight: accepted by the recorder
    rec = store.get(ex.execution_id)
    assert rec.status == "invalidated"
    assert (rec.header.replayable, rec.header.replayableReason) == (False, "manually_invalidated")
    assert rec.finalResponse == {"status": "success"}  # nothing lost
    assert [e.seq for e in rec.events] == [1, 2]


def test_the_recorder_notices_an_operator_invalidation_and_refuses_more_events(open_store):
    store = open_store()
    ex = store.start("X", {})
    ex.event("tool.requested", {"n": 1})
    store.compact()
    store.scheduler.compactor.external_change()  # baseline of SQLite's data_version
    retention.invalidate_in_db(store.engine, ex.execution_id, "bad agent", store.clock())
    assert store.scheduler.sync_external() == 1
    with pytest.raises(tracedb.ExecutionClosedError):
        ex.event("tool.requested", {"n": 2})


def test_a_finish_does_not_clear_a_recording_failure(open_store):
    store = open_store()
    ex = store.start("X", {})
    ex.mark_recording_failure("queue overflow")
    store.compact()
    ex.finish({"status": "success"})
    rec = store.get(ex.execution_id)
    assert (rec.status, rec.header.replayable, rec.header.replayableReason) == (
        "completed", False, "recording_failure",
    )


def test_steps_of_a_pruned_trace_are_skipped_and_compaction_goes_on(open_store, clock):
    assert_compaction_skips_a_pruned_trace(open_store(), clock)


def test_a_database_that_does_not_belong_to_the_wal_is_refused(open_store, data_dir, tmp_path):
    store = open_store()
    record_seed_002(store)
    store.close()
    os.rename(os.path.join(data_dir, "traces.db"), str(tmp_path / "old.db"))
    for suffix in ("-wal", "-shm"):
        p = os.path.join(data_dir, "traces.db" + suffix)
        if os.path.exists(p):
            os.remove(p)
    # A fresh database is fine: the whole WAL is still there to rebuild it.
    store = open_store()
    assert [r.execution_id for r in store.list()] == ["exec-a1b2c3d4"]
    store.close()
    # The WAL replaced by a new, empty one: the database is ahead of it.
    import shutil

    shutil.rmtree(os.path.join(data_dir, "wal"))
    with pytest.raises(tracedb.IntegrityError) as err:
        tracedb.open(data_dir, config={"compact_interval_ms": 0})
    assert err.value.hint


# Alembic cannot reflect SQLite's expression indexes and says so; the test compares them itself.
@pytest.mark.filterwarnings("ignore:autogenerate skipping metadata-specified expression-based index")
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
def test_migrated_schema_equals_the_models(tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from tracedb.projection.models import metadata as shared
    from tracedb.projection.models import sqlite_metadata

    # The tables of both databases, and SQLite's own (stats_rollup, migration 0007).
    metadata = sa.MetaData()
    for table in (*shared.tables.values(), *sqlite_metadata.tables.values()):
        table.to_metadata(metadata)
    engine = db.create_engine(str(tmp_path / "t.db"), write=True)
    db.migrate(engine)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        # Every index the models declare exists under its name, the expression ones too, each
        # with the models' columns and expressions in order and partial where they are.
        stored = dict(conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL").all())
        declared = {ix.name: ix for table in metadata.tables.values() for ix in table.indexes}
        assert set(stored) == set(declared)
        for name, ix in declared.items():
            parts = [str(e) if not hasattr(e, "name") else e.name for e in ix.expressions]
            normal = " ".join(stored[name].split())
            for part in parts:
                assert part in normal, (name, part, normal)
            assert (" WHERE " in normal) == ("sqlite_where" in ix.dialect_kwargs and ix.dialect_kwargs["sqlite_where"] is not None), name
        # The triggers that keep stats_rollup, as the migrations wrote them.
        triggers = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").all())
        assert {n: " ".join(t.split()) for n, t in triggers.items()} == {
            n: " ".join(f"CREATE TRIGGER {n} {body}".split()) for n, body in _rollup_migration().TRIGGERS.items()}
        pragmas = {
            p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
            for p in ("foreign_keys", "journal_mode", "synchronous", "auto_vacuum")
        }
    assert pragmas == {"foreign_keys": 1, "journal_mode": "wal", "synchronous": 2, "auto_vacuum": 2}
    assert db.migrate(engine) == db.HEAD_REVISION  # idempotent
    engine.dispose()


def _rollup_migration():
    """Migration 0008, whose triggers keep stats_rollup (0007 made the table)."""
    import importlib.util
    import pathlib

    import tracedb.migrations

    path = next(pathlib.Path(tracedb.migrations.__path__[0], "versions").glob("0008_*.py"))
    spec = importlib.util.spec_from_file_location("migration_0008", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_deleting_a_trace_deletes_its_steps(open_store):
    store = open_store()
    ex = record_seed_002(store)
    store.compact()
    with store.engine.begin() as conn:
        conn.execute(traces.delete().where(traces.c.execution_id == ex.execution_id))
    assert counts(store.engine)[:2] == (0, 0)


def test_background_compactor_applies_without_being_asked(data_dir, clock):
    import threading

    with tracedb.open(data_dir, config={"compact_interval_ms": 20, "compact_batch_records": 10}, clock=clock) as store:
        applied = threading.Event()
        original = store.scheduler.forget_applied

        def spy(lsn):
            original(lsn)
            if lsn >= target[0]:
                applied.set()

        target = [10**9]
        store.scheduler.forget_applied = spy
        ex = store.start("X", {})
        for i in range(30):
            ex.event("tool.requested", {"i": i})
        target[0] = store.durable_lsn
        assert applied.wait(30)
        assert counts(store.engine)[1] == 30


def test_a_compactor_process_applies_every_record_once_and_the_store_takes_over_if_it_dies(open_store):
    import signal

    store = open_store(compact_worker=True, compact_batch_records=50, wal_segment_size_bytes=4096)
    worker = store.scheduler.worker
    assert worker is not None and worker.pid != os.getpid()
    for i in range(10):
        ex = store.start("X", {"i": i})
        for j in range(9):
            ex.event("tool.requested", {"j": j})
        ex.finish({"status": "success"})
    # A read compacts first, through the child: every event is there, once.
    assert [e.seq for e in store.get(ex.execution_id).events] == list(range(1, 11))
    assert counts(store.engine) == (10, 100, store.durable_lsn)
    # WAL segments below what the child applied were deleted by the recorder.
    assert wal.list_segments(os.path.join(store.data_dir, "wal"))[0].number > 1

    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    ex = store.start("Y", {})
    ex.event("tool.requested", {"after": "the child died"})
    ex.finish({"status": "success"})
    result = store.compact()  # the child is gone: compaction goes on in-process
    assert store.scheduler.worker is None and result.applied_lsn == store.durable_lsn
    assert counts(store.engine) == (11, 102, store.durable_lsn)
    store.close()
    assert worker.proc.poll() is not None


def test_closing_a_store_stops_its_compactor_process(open_store):
    store = open_store(compact_worker=True)
    ex = store.start("X", {})
    ex.event("tool.requested", {})
    pid_proc = store.scheduler.worker.proc
    store.close()
    assert pid_proc.poll() == 0
    with tracedb.open(store.data_dir) as again:
        rec = again.get(ex.execution_id)
        assert rec.status == "incomplete" and [e.seq for e in rec.events] == [1]


def test_a_stalled_compactor_process_is_killed_and_compaction_goes_on_in_process(open_store, monkeypatch):
    import signal

    from tracedb.projection import compactor_worker

    store = open_store(compact_worker=True)
    worker = store.scheduler.worker
    assert worker is not None
    # Shortened only now: the child's start-up (its imports) may take longer than this.
    monkeypatch.setattr(compactor_worker, "STALL_S", 0.5)
    ex = store.start("X", {})
    ex.event("tool.requested", {})
    os.kill(worker.pid, signal.SIGSTOP)  # stands for a database call that never returns
    try:
        result = store.compact()
    finally:
        worker.proc.wait()
    assert store.scheduler.worker is None and result.applied_lsn == store.durable_lsn
    assert [e.seq for e in store.get(ex.execution_id).events] == [1]


def test_the_compactor_process_gets_its_settings_on_stdin_not_its_command_line(open_store):
    store = open_store(compact_worker=True)
    with open(f"/proc/{store.scheduler.worker.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert not any(b"database" in a or b"traces.db" in a for a in argv)


def test_the_compactor_processs_answers_are_all_read_when_they_arrive_together(monkeypatch):
    # "progress" and "ok" often arrive in one read; select() must not wait for bytes already read.
    import types

    from tracedb.projection import compactor_worker

    monkeypatch.setattr(compactor_worker, "STALL_S", 1.0)
    r, w = os.pipe()
    reader = os.fdopen(r, "rb")
    worker = compactor_worker.CompactorWorker.__new__(compactor_worker.CompactorWorker)
    worker._buf = b""
    worker.proc = types.SimpleNamespace(stdout=reader, pid=0, kill=lambda: None, poll=lambda: None)
    os.write(w, b"progress 5\nok {}\n")
    try:
        assert worker._read_line() == "progress 5"
        assert worker._read_line() == "ok {}"
    finally:
        os.close(w)
        reader.close()


def test_the_compactor_process_answers_many_batches_without_being_taken_for_stalled(open_store, monkeypatch):
    # The child reports each batch on its own line; lines that arrive together must all be
    # read (a buffered pipe would hide them from select and the child would look stalled).
    from tracedb.projection import compactor_worker

    store = open_store(compact_worker=True, compact_batch_records=5)
    assert store.scheduler.worker is not None
    monkeypatch.setattr(compactor_worker, "STALL_S", 3.0)  # after the child's start-up
    for i in range(20):
        ex = store.start("X", {"i": i})
        for j in range(4):
            ex.event("tool.requested", {"j": j})
    result = store.compact()
    assert result.batches >= 20 and result.applied_lsn == store.durable_lsn
    assert store.scheduler.worker is not None, "the child was given up on"
    assert counts(store.engine)[1] == 80


# -- in-process compaction takes what was just recorded from memory --------------------------
def _table_rows(engine):
    with engine.connect() as conn:
        t = [tuple(r) for r in conn.execute(sa.select(traces).order_by(traces.c.execution_id))]
        s = [tuple(r) for r in conn.execute(sa.select(trace_steps).order_by(trace_steps.c.lsn))]
    return t, s


def _record_mixed(store, n=12):
    import asyncio

    for i in range(n):
        ex = store.start("mixed", {"i": i, "text": "naïve \u2028 \"quoted\"\n"}, f"exec-{i:03d}")
        ex.event("tool.requested", {"q": i, "nested": {"a": [1, 2.5, None, True]}})
        ex.event("ROUTER_DECISION", {"agent": f"agent-{i}"})
        ex.event("llm.responded", "just a string")
        ex.event("custom.thing", None)
        if i % 3 == 0:
            ex.finish({"status": "success", "payload": {"i": i}})
        elif i % 3 == 1:
            ex.invalidate("operator said so")

    from tracedb.recorder.state import StagedBatch

    store.start("staged", {"via": "the sidecar's staging"}, "exec-staged")

    async def more():
        batch = StagedBatch()  # the sidecar's path: events staged, then one WAL append
        for k in range(3):
            store.staging.stage_event(batch, "exec-staged", "tool.requested", {"k": k})
        store.staging.stage_finish(batch, "exec-staged", {"status": "success"})
        await store.staging.append_staged(batch, asyncio.get_running_loop())
        astore = tracedb.AsyncStore(store)
        ex = await astore.start("async", {"k": 1}, "exec-async")
        for j in range(5):
            await astore.event(ex.execution_id, "tool.responded", {"j": j})
        await astore.finish(ex.execution_id, {"status": "success"})

    asyncio.run(more())


def test_in_process_compaction_applies_from_memory_exactly_what_the_wal_holds(open_store, data_dir, tmp_path, monkeypatch):
    import shutil

    from tracedb.projection import compactor as compactor_mod

    store = open_store()
    _record_mixed(store)
    wal_copy = str(tmp_path / "wal-copy")
    shutil.copytree(os.path.join(data_dir, "wal"), wal_copy, ignore=shutil.ignore_patterns("LOCK"))

    def no_disk(*a, **k):
        raise AssertionError("the compactor read the WAL segments although the records were in memory")

    monkeypatch.setattr(compactor_mod.wal, "WalReader", no_disk)
    result = store.compact()
    monkeypatch.undo()
    assert result.applied_lsn == store.durable_lsn and result.steps == 12 * 4 + 4 + 6 + 4
    from_memory = _table_rows(store.engine)

    # The same WAL compacted from its segments by a fresh compactor gives the same rows.
    engine = db.create_engine(str(tmp_path / "from-disk.db"), write=True)
    db.migrate(engine)
    db.ensure_checkpoint(engine, store.recorder_id, 0)
    comp = compactor_mod.Compactor(engine, wal_copy, store.recorder_id, 0, clock=lambda: 0)
    comp.compact(result.applied_lsn)
    comp.close()
    from_disk = _table_rows(engine)
    engine.dispose()
    assert from_memory[1] == from_disk[1]
    assert from_memory[0] == from_disk[0]
    assert store.verify().ok


def test_a_compactor_that_fell_behind_the_memory_window_reads_the_segments(open_store):
    store = open_store(compact_batch_records=5)  # a window of 8 batches: 40 records
    for i in range(30):
        ex = store.start("X", {"i": i})
        ex.event("tool.requested", {"i": i})
        ex.finish({"status": "success"})
    assert store.durable_lsn == 90
    result = store.compact()
    assert result.records == 90 and result.steps == 60
    assert counts(store.engine) == (30, 60, 90)
    # Caught up: what comes next is taken from memory again, and nothing twice.
    ex = store.start("Y", {})
    ex.event("tool.requested", {})
    assert store.compact().records == 2
    assert counts(store.engine) == (31, 61, 92)


def test_compaction_from_memory_that_fails_is_applied_again_from_the_segments(open_store, monkeypatch):
    store = open_store()
    record_seed_002(store)
    real = store.scheduler.compactor._write
    calls = {"n": 0}

    def failing_once(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sa.exc.OperationalError("INSERT", {}, Exception("injected: database is locked"))
        return real(*a, **k)

    monkeypatch.setattr(store.scheduler.compactor, "_write", failing_once)
    with pytest.raises(sa.exc.OperationalError):
        store.compact()
    # The records taken from memory are gone from it; the retry reads them from the WAL.
    result = store.compact()
    assert result.records == 9 and result.steps == 8
    assert counts(store.engine) == (1, 8, 9)


def _record_for(store, seconds: float) -> None:
    import time

    stop = time.monotonic() + seconds
    n = 0
    while time.monotonic() < stop:
        ex = store.start("X", {"n": n})
        for j in range(4):
            ex.event("tool.requested", {"j": j})
        ex.finish({"status": "success"})
        n += 1


def _worker_of(store, timeout_s: float = 30.0):
    """The store's compactor process once it has one (it starts in the background)."""
    import time

    deadline = time.monotonic() + timeout_s
    while store.scheduler.worker is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return store.scheduler.worker


def _auto_store(open_store, monkeypatch, rate: int, cores: int = 2):
    from tracedb.recorder import scheduler as scheduler_mod

    monkeypatch.setattr(scheduler_mod, "AUTO_WORKER_RATE", rate)
    monkeypatch.setattr(scheduler_mod, "_cores", lambda: cores)
    return open_store(compact_worker="auto", compact_interval_ms=20, compact_batch_records=100)


def test_auto_moves_compaction_to_a_process_once_the_store_records_fast_and_applies_every_record_once(
    open_store, monkeypatch
):
    store = _auto_store(open_store, monkeypatch, rate=50)
    assert store.scheduler.worker is None  # nothing recorded yet: no process
    _record_for(store, 1.5)
    worker = _worker_of(store)
    assert worker is not None and worker.pid != os.getpid()
    assert not store.staging.hinting  # the child reads the segments: nothing kept in memory for it
    _record_for(store, 0.3)
    store.compact()
    n_traces, n_steps, applied = counts(store.engine)
    assert applied == store.durable_lsn
    # Every start, event and finish once, across the switch: 1 + 4 + 1 records, 5 steps each.
    assert n_steps == 5 * n_traces and store.durable_lsn == 6 * n_traces
    store.close()
    assert worker.proc.poll() == 0


def test_auto_keeps_compaction_in_process_below_the_rate_and_on_one_core(open_store, monkeypatch, tmp_path):
    slow = _auto_store(open_store, monkeypatch, rate=10**9)
    _record_for(slow, 1.0)
    assert slow.scheduler.worker is None and slow.staging.hinting
    one_core = open_store(str(tmp_path / "one"), compact_worker="auto", compact_interval_ms=20)
    from tracedb.recorder import scheduler as scheduler_mod

    monkeypatch.setattr(scheduler_mod, "AUTO_WORKER_RATE", 50)
    monkeypatch.setattr(scheduler_mod, "_cores", lambda: 1)
    one_core.close()
    one_core = open_store(str(tmp_path / "one"), compact_worker="auto", compact_interval_ms=20)
    _record_for(one_core, 1.0)
    assert one_core.scheduler.worker is None
    slow.compact()
    assert counts(slow.engine)[2] == slow.durable_lsn


def test_auto_keeps_compaction_in_process_when_sys_executable_is_not_a_python_interpreter(
    open_store, monkeypatch, tmp_path
):
    # A frozen application or an embedding server (uWSGI): starting `sys.executable -m ...`
    # would start the application or the server again, not a compactor.
    import sys

    from tracedb.projection import compactor_worker

    for frozen, executable in ((True, sys.executable), (False, str(tmp_path / "uwsgi")), (False, "")):
        monkeypatch.setattr(sys, "frozen", frozen, raising=False)
        monkeypatch.setattr(sys, "executable", executable)
        assert not compactor_worker.interpreter_runs_python()
    monkeypatch.setattr(sys, "frozen", False, raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "uwsgi"))
    started = []
    monkeypatch.setattr(compactor_worker, "CompactorWorker", lambda **kw: started.append(kw))
    store = _auto_store(open_store, monkeypatch, rate=50)
    _record_for(store, 1.0)
    assert started == [] and store.scheduler.worker is None and store.staging.hinting  # never even tried
    store.compact()
    assert counts(store.engine)[2] == store.durable_lsn


def test_a_starting_compactor_process_holds_up_no_read_and_takes_over_where_the_thread_got(
    open_store, monkeypatch
):
    import threading
    import time

    from tracedb.projection import compactor_worker

    started, release = threading.Event(), threading.Event()
    ready_at, outcomes = [], []

    class SlowToHandOver(compactor_worker.CompactorWorker):
        def __init__(self, **kw):
            super().__init__(**kw)  # the child is up, with the checkpoint as of now
            ready_at.append(self.applied_lsn)
            started.set()
            release.wait(30)  # as a slow start: the recorder goes on meanwhile

        def compact(self, to_lsn):
            try:
                outcomes.append(super().compact(to_lsn))
            except Exception as e:
                outcomes.append(e)
                raise
            return outcomes[-1]

    monkeypatch.setattr(compactor_worker, "CompactorWorker", SlowToHandOver)
    store = _auto_store(open_store, monkeypatch, rate=50)
    while not started.is_set():
        _record_for(store, 0.2)
    _record_for(store, 0.3)
    t0 = time.monotonic()
    result = store.compact()  # in-process: the child's start holds no lock
    assert time.monotonic() - t0 < 5 and result.applied_lsn == store.durable_lsn > ready_at[0]
    assert store.scheduler.worker is None
    release.set()
    assert _worker_of(store) is not None
    _record_for(store, 0.5)
    in_process = result.applied_lsn
    assert store.compact().applied_lsn == store.durable_lsn  # through the child
    # Every compaction the child ran (the background thread's too): none failed, none met rows
    # already there, and together they applied, once each, what came after the thread's last.
    assert outcomes and all(isinstance(o, tracedb.CompactResult) and o.skipped_records == 0 for o in outcomes), outcomes
    applied_by_child = [o for o in outcomes if o.records]
    first_start = applied_by_child[0].applied_lsn - applied_by_child[0].records
    assert first_start >= in_process
    assert sum(o.records for o in applied_by_child) == store.durable_lsn - first_start
    n_traces, n_steps, applied = counts(store.engine)
    assert applied == store.durable_lsn and n_steps == 5 * n_traces and store.durable_lsn == 6 * n_traces


def test_the_cyclic_collector_is_off_during_a_batch_and_restored_after(open_store, monkeypatch):
    """A batch frees everything it makes, so collecting while it runs is wasted work; the
    collector comes back on after the batch, also when the batch fails, and one the application
    turned off stays off."""
    import gc

    from tracedb.projection import compactor as compactor_mod
    from tracedb.records.fold import Fold

    seen = []
    add = Fold.add

    def watching_add(self, *a, **k):
        seen.append(gc.isenabled())
        return add(self, *a, **k)

    monkeypatch.setattr(Fold, "add", watching_add)
    store = open_store()
    store.start("X", {}).finish({"status": "success"})
    assert gc.isenabled()
    store.compact()
    assert seen and not any(seen)
    assert gc.isenabled()

    def failing_add(self, *a, **k):
        seen.append(gc.isenabled())
        raise RuntimeError("fold failed")

    monkeypatch.setattr(Fold, "add", failing_add)
    store.start("X", {}).finish({"status": "success"})
    with pytest.raises(RuntimeError, match="fold failed"):
        store.compact()
    assert seen[-1] is False and gc.isenabled()

    gc.disable()
    try:
        with compactor_mod._collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_batch_of_ids_that_land_inside_the_index_is_inserted_in_id_order_and_reads_back_the_same(
    open_store, monkeypatch, tmp_path
):
    """Caller-given uuid4 ids, executions interleaved: once the table holds greater ids, a
    batch's traces and steps go in by execution id (a stable sort: each execution's steps stay
    in seq order); what is read back is what was recorded. The store's own ids, which grow with
    time, are inserted in log order."""
    import random
    import uuid

    from tracedb.projection import compactor

    rng = random.Random(7)  # uuid4 ids, the same in every run
    keyed = []
    real = compactor._in_key_order
    monkeypatch.setattr(compactor, "_in_key_order", lambda steps: keyed.append(len(steps)) or real(steps))
    store = open_store()
    expected = {}
    for round_ in range(3):
        execs = [store.start("X", {"r": round_}, execution_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)))
                 for _ in range(12)]
        for seq in range(1, 6):
            for k, ex in enumerate(execs):
                ex.event("tool.responded", {"k": k, "seq": seq, "r": round_})
        for ex in execs:
            ex.finish({"status": "success"})
        for k, ex in enumerate(execs):
            expected[ex.execution_id] = [{"k": k, "seq": s, "r": round_} for s in range(1, 6)]
        store.compact()
    assert keyed, "no batch was inserted in id order"
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(trace_steps.c.execution_id, trace_steps.c.seq, trace_steps.c.lsn)
                            .order_by(trace_steps.c.lsn)).all()
    assert len(rows) == 36 * 6
    for eid, want in expected.items():
        rec = store.get(eid)
        assert [e.payload for e in rec.events[:5]] == want and rec.header.replayable
        lsns = [lsn for _eid, _seq, lsn in sorted(r for r in rows if r[0] == eid)]
        assert lsns == sorted(lsns)  # seq order is log order within an execution
    assert store.verify().problems == ()

    # The store's own ids (UUIDv7) grow with time: inserted in log order.
    keyed.clear()
    own = open_store(str(tmp_path / "own"))
    for _ in range(3):
        execs = [own.start("X", {}) for _ in range(12)]
        for ex in execs:
            ex.event("tool.responded", {})
        for ex in execs:
            ex.finish({"status": "success"})
        own.compact()
    assert keyed == []


def test_in_key_order_sorts_rows_by_execution_id_and_keeps_each_executions_order():
    from tracedb.projection.compactor import _in_key_order

    flat = ["b", 1, "x", "p", 10, 5, 0, "a", 1, "x", "p", 11, 6, 0, "b", 2, "x", "p", 12, 7, 0, "a", 2, "x", "p", 13, 8, 0]
    assert list(_in_key_order(flat)) == ["a", 1, "x", "p", 11, 6, 0, "a", 2, "x", "p", 13, 8, 0,
                                   "b", 1, "x", "p", 10, 5, 0, "b", 2, "x", "p", 12, 7, 0]
