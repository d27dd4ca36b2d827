"""A fleet on PostgreSQL: recorders compacting at the same time, and connections that drop in the
middle of a compaction. Counts are checked exactly: nothing lost, nothing applied twice."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

import tracedb
from tracedb.projection.models import compaction_checkpoint, trace_steps, traces

from .conftest import counts

pytestmark = pytest.mark.postgres


def test_four_recorders_compact_into_one_database_at_the_same_time(pg_url, pg_engine, tmp_path, children):
    n_exec, n_events, batch = 60, 9, 40  # 660 WAL records each, 17 batches each, interleaved
    fleet = [children(str(tmp_path / f"host{k}"), pg_url, "fleet", str(n_exec), str(n_events), str(batch))
             for k in range(4)]
    recorded = {}
    for child in fleet:
        _, lsn, rid = child.wait_for("RECORDED").split()
        recorded[rid] = int(lsn)
    assert len(recorded) == 4  # four recorder ids
    for child in fleet:  # all four are waiting: release them together
        child.send("GO")
    for child in fleet:
        _, applied, records, steps = child.wait_for("COMPACTED").split()
        assert int(applied) in recorded.values()
        assert (int(records), int(steps)) == (n_exec * (n_events + 2), n_exec * (n_events + 1))
        child.finish()

    assert counts(pg_engine) == (4 * n_exec, 4 * n_exec * (n_events + 1))
    with pg_engine.connect() as conn:
        checkpoints = dict(conn.execute(
            sa.select(compaction_checkpoint.c.recorder_id, compaction_checkpoint.c.applied_lsn)
        ).all())
        per_recorder = dict(conn.execute(
            sa.select(traces.c.recorder_id, sa.func.count())
            .where(traces.c.status == "completed").where(traces.c.replayable == sa.true())
            .group_by(traces.c.recorder_id)
        ).all())
        steps_per_trace = set(conn.execute(
            sa.select(sa.func.count(), sa.func.min(trace_steps.c.seq), sa.func.max(trace_steps.c.seq))
            .group_by(trace_steps.c.execution_id)
        ).all())
        wrong_owner = conn.execute(
            sa.select(sa.func.count()).select_from(traces)
            .where(sa.func.substr(traces.c.execution_id, 1, sa.func.length(traces.c.recorder_id)) != traces.c.recorder_id)
        ).scalar()
    # Each checkpoint stands where its own WAL ended; closing added nothing to compact.
    assert checkpoints == recorded
    assert per_recorder == {rid: n_exec for rid in recorded}
    assert steps_per_trace == {(n_events + 1, 1, n_events + 1)}
    assert wrong_owner == 0
    with tracedb.open(str(tmp_path / "host0"), config={"db_url": pg_url, "compact_interval_ms": 0}) as store:
        assert store.verify().ok


def _terminate(pg_admin, pid: int) -> None:
    # The timeout makes the call wait until the backend is gone: no race with the next command.
    assert pg_admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0]


def _backend_pid(store) -> int:
    return store.scheduler.compactor._conn.connection.driver_connection.info.backend_pid


def _lost(message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("COMMIT", {}, psycopg.OperationalError(message))


def test_a_connection_dropped_during_compaction_loses_and_duplicates_nothing(open_pg_store, pg_engine, pg_admin, caplog):
    store = open_pg_store(compact_batch_records=20)
    for i in range(30):
        ex = store.start("X", {"i": i}, f"exec-{i:03d}")
        for j in range(9):
            ex.event("tool.requested", {"i": i, "j": j})
        ex.finish({"status": "success", "i": i})
    total = store.durable_lsn  # 330 records: 17 batches of 20
    comp = store.scheduler.compactor
    original = comp._pause
    dropped = []

    def fault(point: str) -> None:
        batch = comp._batches_total
        if point == "before_commit" and batch == 3:
            # During a batch: rows written, COMMIT not yet sent. The server rolls it back.
            _terminate(pg_admin, _backend_pid(store))
            dropped.append(("during", batch, comp.applied_lsn))
        elif point == "after_commit" and batch == 6:
            # Between batches: the next batch's first statement finds the connection gone.
            _terminate(pg_admin, _backend_pid(store))
            dropped.append(("between", batch, comp.applied_lsn))
        elif point == "after_commit" and batch == 10:
            # The COMMIT went through but its answer never arrived: the compactor cannot know.
            _terminate(pg_admin, _backend_pid(store))
            dropped.append(("commit answer lost", batch, comp.applied_lsn))
            raise _lost("server closed the connection unexpectedly")
        original(point)

    comp._pause = fault
    with caplog.at_level("WARNING", logger="tracedb.projection.compactor"):
        result = store.compact()
    assert [d[0] for d in dropped] == ["during", "between", "commit answer lost"]
    assert result.reconnects == 3
    # After the lost answer the compactor read its checkpoint back and skipped the batch.
    assert any("committed although its connection failed" in r.getMessage() for r in caplog.records)
    assert result.applied_lsn == total == store.applied_lsn
    assert counts(pg_engine) == (30, 300)
    with pg_engine.connect() as conn:
        assert conn.execute(sa.select(compaction_checkpoint.c.applied_lsn)).scalar() == total
        per_trace = set(conn.execute(
            sa.select(sa.func.count(), sa.func.max(trace_steps.c.seq)).group_by(trace_steps.c.execution_id)
        ).all())
    assert per_trace == {(10, 10)}
    for i in (0, 13, 29):
        rec = store.get(f"exec-{i:03d}")
        assert [e.seq for e in rec.events] == list(range(1, 11))
        assert (rec.status, rec.finalResponse) == ("completed", {"status": "success", "i": i})
    assert store.verify().ok


def test_a_database_that_stays_away_is_reported_and_compaction_resumes_later(open_pg_store, pg_engine, pg_admin, pg_server):
    store = open_pg_store(compact_batch_records=10)
    for i in range(5):
        ex = store.start("X", {"i": i})
        for j in range(5):
            ex.event("tool.requested", {"j": j})
    comp = store.scheduler.compactor
    original = comp._pause

    def always_down(point: str) -> None:
        if point == "before_commit":
            _terminate(pg_admin, _backend_pid(store))
        original(point)

    comp._pause = always_down
    with pytest.raises(tracedb.TraceDBError) as err:
        store.compact()
    assert err.value.code == "db_unavailable"
    assert "pg_hba.conf" in err.value.hint
    assert counts(pg_engine) == (0, 0)  # the one batch tried twice never committed
    comp._pause = original
    result = store.compact()  # the server is back
    assert result.applied_lsn == store.durable_lsn
    assert counts(pg_engine) == (5, 25)
    assert store.verify().ok
