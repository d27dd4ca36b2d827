"""Recovery after SIGKILL (seed 002 scenarios 1-3), during compaction, torn tails, idle sweeper."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

import tracedb
import wal
from tracedb.projection.models import trace_steps, traces

pytestmark = pytest.mark.timeout(120)


def integrity_ok(store) -> bool:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"


def test_scenario_1_crash_before_execution_leaves_no_record(child, open_store):
    c = child("before")
    c.wait_for("READY")
    c.kill()
    store = open_store()
    assert store.list() == []
    assert store.last_recovery.marked_incomplete == 0


def test_scenario_2_crash_during_execution_is_marked_incomplete_with_its_events(child, open_store, data_dir):
    c = child("during")
    c.wait_for("READY")
    c.kill()
    store = open_store()
    assert store.last_recovery.marked_incomplete == 1
    rec = store.get("exec-e5f6g7h8")
    assert rec.status == "incomplete"
    assert (rec.header.replayable, rec.header.replayableReason) == (False, "execution_incomplete")
    assert [(e.seq, e.type) for e in rec.events] == [(1, "INTENT_RECEIVED"), (2, "AGENT_ATTEMPT_START")]
    assert rec.finalResponse is None
    # The marking is itself a durable WAL record (not only a database update).
    ops = [r.payload for r in wal.read_records(os.path.join(data_dir, "wal"), from_lsn=1)]
    assert any(b'"op":"incomplete"' in p and b"exec-e5f6g7h8" in p for p in ops)
    # No automatic retry: nothing new was started.
    assert [r.execution_id for r in store.list()] == ["exec-e5f6g7h8"]
    assert integrity_ok(store) and store.verify().ok


def test_scenario_3_crash_after_final_response_stays_replayable(child, open_store):
    c = child("after")
    c.wait_for("READY")
    c.kill()
    store = open_store()
    rec = store.get("exec-a1b2c3d4")
    assert (rec.status, rec.header.replayable, rec.header.replayableReason) == ("completed", True, None)
    assert len(rec.events) == 8 and rec.events[-1].type == "FINAL_RESPONSE"
    assert store.last_recovery.marked_incomplete == 0


def check_bulk(store, n: int) -> None:
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(traces)).scalar() == n
        rows = conn.execute(
            sa.select(trace_steps.c.execution_id, sa.func.count(), sa.func.max(trace_steps.c.seq))
            .group_by(trace_steps.c.execution_id)
        ).all()
    per = {eid: (cnt, mx) for eid, cnt, mx in rows}
    for i in range(n):
        eid = f"exec-{i:05d}"
        expected = 11 if i % 2 == 0 else 10  # finished ones have FINAL_RESPONSE as step 11
        assert per[eid] == (expected, expected), eid
        rec = store.get(eid)
        if i % 2 == 0:
            assert (rec.status, rec.header.replayable) == ("completed", True)
        else:
            assert (rec.status, rec.header.replayableReason) == ("incomplete", "execution_incomplete")
    assert integrity_ok(store)
    assert store.verify().ok


@pytest.mark.parametrize("point", ["before_commit:3", "after_commit:3"], ids=["inside_transaction", "between_batches"])
def test_sigkill_during_compaction_loses_and_duplicates_nothing(child, open_store, point):
    n = 40  # 40 * 11.5 records, batches of 100 records: the kill lands in the middle
    c = child("bulk", str(n), pause=point)
    c.wait_for("PAUSED")
    c.kill()
    store = open_store()
    check_bulk(store, n)


def test_torn_wal_tail_is_truncated_and_every_acknowledged_record_kept(child, open_store, data_dir):
    c = child("after")
    c.wait_for("READY")
    c.kill()
    seg = wal.list_segments(os.path.join(data_dir, "wal"))[-1].path
    size = os.path.getsize(seg)
    with open(seg, "ab") as f:
        f.write(b"\x13\x37" * 21)  # half a record: what a crash mid-write leaves
    store = open_store()
    assert store.last_recovery.wal_truncated_bytes == 42
    assert os.path.getsize(seg) == size
    assert len(store.get("exec-a1b2c3d4").events) == 8


def test_idle_executions_are_marked_incomplete_by_the_sweeper(open_store, clock):
    store = open_store(idle_timeout_s=600)
    idle = store.start("X", {})
    idle.event("tool.requested", {})
    clock.advance(300)
    busy = store.start("Y", {})
    assert store.sweep_idle() == 0
    clock.advance(301)
    assert store.sweep_idle() == 1
    assert store.get(idle.execution_id).status == "incomplete"
    assert store.get(busy.execution_id).status == "running"
    busy.event("tool.requested", {})
    with pytest.raises(tracedb.ExecutionClosedError):
        idle.event("tool.requested", {})


def test_the_sweeper_leaves_an_execution_that_recorded_after_it_looked(open_store, clock):
    # The sweep lists idle executions, then marks them one by one; an event numbered in between
    # (the sidecar stages events before queueing them) must win: no incomplete record before it.
    store = open_store(idle_timeout_s=600)
    ex = store.start("X", {})
    clock.advance(601)
    limit = clock() - 600 * 10**9
    (state,) = [s for s in store.staging.open_states() if s.last_activity_ns <= limit]
    ex.event("tool.requested", {"late": True})
    assert store.staging.mark_incomplete([state], "idle", idle_since_ns=limit) == 0
    assert store.get(ex.execution_id).status == "running"
    assert ex.event("tool.requested", {}) == 2


def test_recover_on_a_live_store_leaves_its_own_executions_alone(open_store):
    store = open_store()
    ex = store.start("X", {})
    result = store.recover()
    assert result.marked_incomplete == 0
    assert ex.event("tool.requested", {}) == 1
