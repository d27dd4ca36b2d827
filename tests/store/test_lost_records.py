"""An execution flagged `recording_failure` (records of it were lost) keeps that reason and its
note through every later transition: a clean stop, the idle sweeper, recovery after a crash,
reads with no recorder running, a rebuild from the WAL. The flag applies to an execution
recovery closed, and an invalidation still wins."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import tracedb
from tests.pg.conftest import pg_admin, pg_schema, pg_server, pg_url  # noqa: F401 - fixtures
from tracedb.maintenance import verify_store as damage
from tracedb.config import as_config
from tracedb.projection.models import traces
from tracedb.reads.reader import Reader
from tracedb.records.record import LostRecords, lost_records, lost_records_note

from .child import NOTE

FLAGGED = ("incomplete", False, "recording_failure")


def row(store, execution_id: str) -> tuple:
    """(status, replayable, replayable_reason, status_note) as the database holds them."""
    store.compact()
    with store.engine.connect() as conn:
        r = conn.execute(
            sa.select(traces.c.status, traces.c.replayable, traces.c.replayable_reason, traces.c.status_note)
            .where(traces.c.execution_id == execution_id)
        ).one()
    return r.status, bool(r.replayable), r.replayable_reason, r.status_note


def flagged(store, compacted: bool) -> str:
    ex = store.start("ProcessIntent", {"intent": "ProcessIntent"})
    ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
    ex.mark_recording_failure(NOTE)
    if compacted:  # the flag in the database, the close in a later batch (the UPDATE's guard)
        store.compact()
    return ex.execution_id


def test_the_note_says_how_many_records_were_lost_and_when():
    assert NOTE.startswith("3 records lost between 2024-01-15T10:30:01.000000Z and 2024-01-15T10:30:04.000000Z: ")
    assert lost_records(NOTE) == LostRecords(3, "2024-01-15T10:30:01.000000Z", "2024-01-15T10:30:04.000000Z")
    one = lost_records_note(1, 5, 5)
    assert one.startswith("1 record lost between ") and lost_records(one).count == 1
    # What clients wrote before the times were kept: the count alone.
    older = "2 record(s) of this execution were not recorded: the recorder was unreachable"
    assert lost_records(older) == LostRecords(2)
    assert lost_records("idle") is None and lost_records(None) is None


@pytest.mark.parametrize("compacted", [False, True], ids=["one-batch", "later-batch"])
def test_a_clean_stop_keeps_recording_failure_and_its_note(open_store, data_dir, compacted):
    store = open_store()
    eid = flagged(store, compacted)
    store.close()  # marks it incomplete: nobody can record into it any more
    assert row(open_store(), eid) == (*FLAGGED, NOTE)


@pytest.mark.parametrize("compacted", [False, True], ids=["one-batch", "later-batch"])
def test_the_idle_sweeper_keeps_it(open_store, clock, compacted):
    store = open_store(idle_timeout_s=60)
    eid = flagged(store, compacted)
    clock.advance(120)
    assert store.sweep_idle() == 1
    assert row(store, eid) == (*FLAGGED, NOTE)


def test_abandon_keeps_it(open_store):
    store = open_store()
    eid = flagged(store, True)
    assert store.abandon(eid, "the agent died") == "running"
    assert row(store, eid) == (*FLAGGED, NOTE)


@pytest.mark.parametrize("compacted", [False, True], ids=["uncompacted", "compacted"])
def test_recovery_after_a_crash_keeps_it(child, open_store, compacted):
    c = child("flagged", *(["compacted"] if compacted else []))
    c.wait_for("READY")
    c.kill()
    store = open_store()
    assert store.last_recovery.marked_incomplete == 1
    assert row(store, "exec-lost") == (*FLAGGED, NOTE)


def test_reads_with_no_recorder_running_show_it_incomplete_and_flagged(child, data_dir):
    c = child("flagged")
    c.wait_for("READY")
    c.kill()  # no recorder: the WAL holds the flag, nobody compacted it
    with Reader.open(as_config(None, data_dir)) as reader:
        view = reader.inspect("exec-lost")
    assert (view["status"], view["replayable"], view["replayable_reason"]) == FLAGGED
    assert view["note"] == NOTE


def test_a_rebuild_from_the_wal_keeps_it(open_store, data_dir):
    store = open_store()
    eid = flagged(store, True)
    store.close()
    damage.rebuild(as_config({"compact_interval_ms": 0, "idle_timeout_s": 0}, data_dir), open_store=lambda cfg: tracedb.open(config=cfg))
    assert row(open_store(), eid) == (*FLAGGED, NOTE)


def test_an_execution_recovery_closed_can_be_flagged(child, open_store):
    # Its client dropped records while the recorder was down; recovery closed it meanwhile.
    c = child("during")
    c.wait_for("READY")
    c.kill()
    store = open_store()
    store.mark_recording_failure("exec-e5f6g7h8", NOTE)
    assert row(store, "exec-e5f6g7h8") == (*FLAGGED, NOTE)


def test_a_finish_after_the_flag_completes_it_and_keeps_the_note(open_store):
    store = open_store()
    ex = store.start("X", {})
    ex.mark_recording_failure(NOTE)
    store.compact()
    ex.finish({"status": "success"})
    store.close()
    assert row(open_store(), ex.execution_id) == ("completed", False, "recording_failure", NOTE)


def test_an_invalidation_still_wins(open_store):
    store = open_store()
    eid = flagged(store, True)
    store.invalidate(eid, "bad run")
    assert row(store, eid) == ("invalidated", False, "manually_invalidated", "bad run")
    with pytest.raises(tracedb.ExecutionClosedError):
        store.mark_recording_failure(eid, NOTE)


def test_records_an_older_tracedb_wrote_fold_as_they_did(open_store):
    # The WAL format is unchanged: the same records, written byte for byte as before, give the
    # same rows; only a flag followed by `incomplete` now keeps the flag.
    store = open_store()
    w = store.wal
    older = b"2 record(s) of this execution were not recorded: the recorder was unreachable"
    w.append(b'{"op":"start","id":"e-done","intent":"X","envelope":{},"hash":"sha256:00","t":1}')
    w.append(b'{"op":"recording_failure","id":"e-done","detail":"' + older + b'","t":2}')
    w.append(b'{"op":"finish","id":"e-done","seq":1,"response":{"status":"success"},"t":3}')
    w.append(b'{"op":"start","id":"e-idle","intent":"X","envelope":{},"hash":"sha256:00","t":1}')
    w.append(b'{"op":"incomplete","id":"e-idle","why":"idle","t":4}')
    w.append(b'{"op":"start","id":"e-ok","intent":"X","envelope":{},"hash":"sha256:00","t":1}')
    w.append(b'{"op":"finish","id":"e-ok","seq":1,"response":{"status":"success"},"t":3}')
    assert row(store, "e-done") == ("completed", False, "recording_failure", older.decode())
    assert row(store, "e-idle") == ("incomplete", False, "execution_incomplete", "idle")
    assert row(store, "e-ok") == ("completed", True, None, None)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request, tmp_path):
    """settings for open_store: the data directory's SQLite file, or this test's PostgreSQL schema."""
    if request.param == "sqlite":
        return {}
    return {"db_url": request.getfixturevalue("pg_url")}


def test_the_update_applies_the_rule_to_the_row_it_finds(open_store, database, clock):
    # Each change lands in a later batch than the one before, so that the database's row is
    # what the UPDATE statement guards (the delta assumes a running, unflagged row).
    store = open_store(idle_timeout_s=60, **database)
    swept = flagged(store, True)
    finished = flagged(store, True)
    plain = store.start("X", {}).execution_id
    store.compact()
    clock.advance(120)
    store.finish(finished, {"status": "success"})
    assert store.sweep_idle() == 2  # the flagged one and the plain one
    assert row(store, swept) == (*FLAGGED, NOTE)
    assert row(store, finished) == ("completed", False, "recording_failure", NOTE)
    assert row(store, plain) == ("incomplete", False, "execution_incomplete", "idle")
    store.mark_recording_failure(plain, NOTE)  # flagged after it was closed: the flag wins
    assert row(store, plain) == (*FLAGGED, NOTE)
