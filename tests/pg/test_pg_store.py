"""The store against a real PostgreSQL server: migrations, recording, recovery, retention,
invalidation, verify, and several recorders sharing one database."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

import tracedb
from tracedb.projection import db
from tracedb.maintenance import retention
from tracedb.projection.models import compaction_checkpoint, trace_steps, traces

from .conftest import (
    ENVELOPE,
    SEED_002_EVENTS,
    FakeClock,
    assert_compaction_skips_a_pruned_trace,
    counts,
    invalidated_in_the_database,
    record_seed_002,
)

pytestmark = pytest.mark.postgres


def test_the_same_migrations_build_the_models_schema_on_postgresql(pg_engine, pg_admin, pg_schema):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from tracedb.projection.models import metadata as shared
    from tracedb.projection.models import postgresql_metadata

    # The tables of both databases, and PostgreSQL's own (stats_rollup, migration 0009).
    metadata = sa.MetaData()
    for table in (*shared.tables.values(), *postgresql_metadata.tables.values()):
        table.to_metadata(metadata)
    assert db.migrate(pg_engine) is None  # was empty
    with pg_engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        # The triggers that keep stats_rollup, as migration 0009 wrote them.
        triggers = {r[0] for r in conn.exec_driver_sql(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = 'traces'::regclass")}
        assert triggers == {"tr_traces_rollup_update", "tr_traces_rollup_delete"}
        # The planner's statistics on the text of `models` (migration 0010).
        assert conn.exec_driver_sql(
            "SELECT stxname FROM pg_statistic_ext WHERE stxnamespace = current_schema()::regnamespace").scalars().all() \
            == ["st_traces_models_text"]
    assert db.migrate(pg_engine) == db.HEAD_REVISION  # idempotent
    assert db.current_revision(pg_engine) == db.HEAD_REVISION
    tables = {
        r[0] for r in pg_admin.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg_schema,)
        )
    }
    assert tables == {"traces", "trace_steps", "compaction_checkpoint", "stats_rollup", "alembic_version"}
    assert db.integrity_check(pg_engine) == []


def test_the_read_paths_column_declaration_matches_the_migrated_schema_on_postgresql(pg_engine, pg_schema):
    from tests.store.test_schema_columns import declared_columns_match

    db.migrate(pg_engine)
    declared_columns_match(pg_engine)


def test_recorders_starting_together_create_the_schema_exactly_once(pg_url):
    engines = [db.create_engine(pg_url) for _ in range(6)]
    barrier = threading.Barrier(len(engines))
    outcomes: list = []

    def migrate(engine):
        barrier.wait()
        try:
            outcomes.append(db.migrate(engine))
        except Exception as e:  # noqa: BLE001 - the assertion below shows it
            outcomes.append(e)

    threads = [threading.Thread(target=migrate, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in engines:
        e.dispose()
    # Exactly one created the tables (it saw an empty schema); the others found them in place.
    assert sorted(outcomes, key=str) == [db.HEAD_REVISION] * 5 + [None]


def test_recording_and_reading_seed_002_on_postgresql(open_pg_store):
    store = open_pg_store(compact_batch_records=3)
    ex = store.start("ProcessIntent", ENVELOPE, "exec-a1b2c3d4")
    for seq, type_, payload in SEED_002_EVENTS[:-1]:
        assert ex.event(type_, payload) == seq
        if seq == 2:
            store.compact()  # the trace exists; what follows arrives as UPDATEs of it
    ex.finish({"status": "success", "payload": {"total": "1 200,50 €"}})
    rec = store.get("exec-a1b2c3d4")
    assert [(e.seq, e.type, e.payload) for e in rec.events] == [
        *[(s, t, p) for s, t, p in SEED_002_EVENTS[:-1]],
        (8, "FINAL_RESPONSE", {"status": "success", "payload": {"total": "1 200,50 €"}}),
    ]
    assert rec.routerDecision == {"agent": "processor-b"}
    assert rec.finalResponse == {"status": "success", "payload": {"total": "1 200,50 €"}}
    assert (rec.status, rec.header.replayable, rec.header.replayableReason) == ("completed", True, None)
    assert rec.header.envelopeHash == tracedb.compute_envelope_hash(ENVELOPE)
    assert [s.execution_id for s in store.list()] == ["exec-a1b2c3d4"]
    assert store.verify().ok


def test_a_nul_character_in_an_intent_is_refused_and_one_in_the_wal_does_not_stop_compaction(
        open_pg_store, pg_url, tmp_path):
    # PostgreSQL text cannot hold NUL: an intent with one is refused on every backend, before
    # anything is written; inside JSON values a NUL is kept, escaped.
    store = open_pg_store()
    with pytest.raises(tracedb.InvalidInputError, match="NUL"):
        store.start("Odd\x00Intent", {"k": "v"})
    ex = store.start("Odd", {"k": "v\x00w"})
    ex.finish({"text": "a\x00b"})
    rec = store.get(ex.execution_id)
    assert rec.envelope == {"k": "v\x00w"}
    assert rec.finalResponse == {"text": "a\x00b"}
    assert [t.intent for t in store.list()] == ["Odd"]
    store.close()
    # A record an earlier version accepted with such an intent is still applied (the NUL stored
    # as U+FFFD), rather than wedging the recorder's compaction for good.
    from tests.legacy_ids import record_legacy

    data = str(tmp_path / "legacy")
    record_legacy(data, ["exec-nul"], intent="Odd\x00Intent", config={"db_url": pg_url})
    with tracedb.open(data, config={"db_url": pg_url, "compact_interval_ms": 0, "idle_timeout_s": 0}) as again:
        assert again.get("exec-nul").intent == "Odd\ufffdIntent"
        after = again.start("Next", {})
        assert again.get(after.execution_id).status == "running"


def test_recovery_after_a_crash_marks_only_that_recorders_executions(open_pg_store, pg_url, tmp_path, children):
    other = open_pg_store("b")
    theirs = other.start("ProcessIntent", ENVELOPE, "exec-theirs")
    theirs.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
    other.compact()
    # A recorder process on data dir "a" dies in the middle of an execution (seed 002, scenario 2).
    child = children(str(tmp_path / "a"), pg_url, "during")
    child.wait_for("READY")
    child.kill()
    store = open_pg_store("a")
    assert store.last_recovery.incomplete_ids == ("exec-e5f6g7h8",)
    mine = store.get("exec-e5f6g7h8")
    assert (mine.status, mine.header.replayable, mine.header.replayableReason) == (
        "incomplete", False, "execution_incomplete",
    )
    assert [e.type for e in mine.events] == ["INTENT_RECEIVED", "AGENT_ATTEMPT_START"]
    # The other recorder's execution is alive and well: still running, still recording.
    assert other.get("exec-theirs").status == "running"
    assert theirs.event("AGENT_ATTEMPT_START", {"agent": "processor-a"}) == 2


def test_an_execution_id_used_by_two_recorders_never_mixes_their_records(open_pg_store):
    a, b = open_pg_store("a"), open_pg_store("b")
    ea = a.start("X", {"from": "a"}, "exec-dup")
    eb = b.start("X", {"from": "b"}, "exec-dup")  # neither has compacted: both accept it
    ea.event("tool.requested", {"from": "a"})
    eb.event("tool.requested", {"from": "b"})
    eb.event("tool.responded", {"from": "b"})
    ea.finish({"status": "success", "from": "a"})
    keep = b.start("Y", {})
    keep.event("tool.requested", {"n": 1})
    a.compact()
    result = b.compact()
    assert result.skipped_records == 3  # b's start and two events of exec-dup
    b.close()  # b marks its exec-dup incomplete; that must not reach a's completed trace
    rec = a.get("exec-dup")
    assert rec.envelope == {"from": "a"}
    assert [e.payload for e in rec.events] == [{"from": "a"}, {"status": "success", "from": "a"}]
    assert (rec.status, rec.header.replayable) == ("completed", True)
    assert [e.seq for e in a.get(keep.execution_id).events] == [1]
    assert a.verify().ok


def test_a_different_recorder_may_invalidate_an_execution_it_did_not_record(open_pg_store):
    a, b = open_pg_store("a"), open_pg_store("b")
    ex = a.start("X", {})
    ex.finish({"status": "success"})
    a.compact()
    b.invalidate(ex.execution_id, "found bad by host b")
    b.compact()  # the invalidation is a record of b's WAL
    rec = a.get(ex.execution_id)
    assert (rec.status, rec.header.replayableReason) == ("invalidated", "manually_invalidated")


def test_retention_pins_and_fork_lineage_on_postgresql(open_pg_store):
    clock = FakeClock()
    store = open_pg_store(clock=clock)
    old = record_seed_002(store, "exec-old")
    pinned = record_seed_002(store, "exec-pinned")
    parent = record_seed_002(store, "exec-parent")
    clock.advance(40 * 86400)
    fork = store.start("ProcessIntent", ENVELOPE, "exec-fork", parent_execution_id="exec-parent", forked_at_seq=3)
    fork.finish({"status": "success"})
    running = store.start("Later", {})
    store.pin(pinned.execution_id)
    dry = store.prune(older_than_s=30 * 86400, dry_run=True)
    assert (dry.deleted_traces, dry.deleted_steps, dry.dry_run) == (1, 8, True)
    result = store.prune(older_than_s=30 * 86400)
    assert (result.deleted_traces, result.deleted_steps, result.kept_pinned) == (1, 8, 1)
    assert result.bytes_freed >= 0
    assert {s.execution_id for s in store.list()} == {
        "exec-pinned", "exec-parent", "exec-fork", running.execution_id,
    }
    with pytest.raises(tracedb.ExecutionNotFoundError):
        store.get(old.execution_id)
    assert store.prune(older_than_s=30 * 86400).deleted_traces == 0  # idempotent
    store.unpin(pinned.execution_id)
    assert store.prune(older_than_s=30 * 86400).deleted_traces == 1
    assert store.verify().ok


def test_an_operator_invalidation_is_noticed_and_never_overwritten(open_pg_store):
    store = open_pg_store()
    ex = invalidated_in_the_database(store)
    assert not retention.invalidate_in_db(store.engine, ex.execution_id, "again", store.clock())
    ex.event("tool.requested", {"n": 2})  # in flight before the recorder noticed: kept
    store.compact()
    assert store.scheduler.sync_external() == 1
    with pytest.raises(tracedb.ExecutionClosedError):
        ex.event("tool.requested", {"n": 3})
    rec = store.get(ex.execution_id)
    assert (rec.status, rec.header.replayableReason) == ("invalidated", "manually_invalidated")
    assert [e.seq for e in rec.events] == [1, 2]


def test_verify_on_postgresql_checks_constraints_and_the_checkpoint(open_pg_store, pg_engine):
    store = open_pg_store()
    record_seed_002(store)
    store.compact()
    assert store.verify().ok
    with pg_engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE trace_steps DROP CONSTRAINT fk_trace_steps_trace")
        conn.execute(trace_steps.insert().values(
            execution_id="exec-ghost", seq=1, type="tool.requested", payload=None, recorded_at_ns=1, lsn=1,
        ))
    problems = store.verify().problems
    assert "exec-ghost: step 1 has no trace" in problems
    assert any("fk_trace_steps_trace (trace_steps -> traces) is missing" in p for p in problems)
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            "ALTER TABLE trace_steps ADD CONSTRAINT fk_trace_steps_trace FOREIGN KEY (execution_id) "
            "REFERENCES traces (execution_id) ON DELETE CASCADE NOT VALID"
        )
        # A step written outside the compactor: beyond the recorder's checkpoint.
        conn.execute(trace_steps.insert().values(
            execution_id="exec-a1b2c3d4", seq=9, type="tool.requested", payload=None,
            recorded_at_ns=1, lsn=10_000,
        ))
        conn.execute(traces.update().values(last_seq=9))
    problems = store.verify().problems
    assert any("NOT VALID" in p for p in problems)
    assert any("steps from WAL LSN 10000 but its checkpoint is at" in p for p in problems)
    with pg_engine.begin() as conn:
        conn.execute(trace_steps.delete().where(trace_steps.c.lsn >= 10_000))
        conn.execute(trace_steps.delete().where(trace_steps.c.execution_id == "exec-ghost"))
        conn.execute(traces.update().values(last_seq=8))
        conn.exec_driver_sql("ALTER TABLE trace_steps VALIDATE CONSTRAINT fk_trace_steps_trace")
    assert store.verify().ok


def test_the_checkpoint_is_kept_per_recorder(open_pg_store, pg_engine):
    a, b = open_pg_store("a"), open_pg_store("b")
    record_seed_002(a, "exec-a")
    record_seed_002(b, "exec-b")
    record_seed_002(b, "exec-b2")
    a.compact()
    b.compact()
    with pg_engine.connect() as conn:
        rows = dict(conn.execute(sa.select(compaction_checkpoint.c.recorder_id, compaction_checkpoint.c.applied_lsn)).all())
    assert rows == {a.recorder_id: a.durable_lsn, b.recorder_id: b.durable_lsn}
    assert counts(pg_engine) == (3, 24)


def test_steps_of_a_trace_pruned_meanwhile_are_skipped_and_compaction_goes_on(open_pg_store):
    clock = FakeClock()
    assert_compaction_skips_a_pruned_trace(open_pg_store(clock=clock), clock)


def test_copy_errors_reach_the_compactor_as_sqlalchemy_errors(open_pg_store):
    # Steps go in with COPY on PostgreSQL; a constraint it breaks must be the IntegrityError the
    # compactor's record-by-record path catches, and the transaction must roll back cleanly.
    store = open_pg_store()
    copy = store.scheduler.compactor._insert_steps
    with store.engine.connect() as conn:
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin():
                copy.execute(conn, ["exec-missing", 1, "tool.requested", "{}", 1, 1, 0])
        with conn.begin():
            assert conn.execute(sa.select(sa.func.count()).select_from(trace_steps)).scalar() == 0
