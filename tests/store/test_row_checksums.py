"""Per-row checksums of the stored values: a byte changed inside a step's payload, the final
response, the router decision or meta in traces.db is found by `verify` (exit 4, naming the row)
and by every read of the record (not replayable, `record_corrupted`, `replay` exits 6 without
printing the changed value). Stores migrated from revision 0003 get checksums for their rows."""

from __future__ import annotations

import os
import sqlite3

import orjson
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import tracedb
from tracedb.projection import db
from tracedb.cli import main

ENVELOPE = {"intent": "Pay", "payload": {"invoice": "inv-17"}}
EID = "exec-checksums"


def record(store, execution_id: str = EID) -> None:
    """A completed execution whose values hold digits to change: seq 2 holds 1234, the router
    decision (seq 3) 4321, the final response 5678; seq 4 is a bare number (stored by SQLite as
    a REAL, not as text)."""
    ex = store.start("Pay", ENVELOPE, execution_id)
    ex.event("INTENT_RECEIVED", {"intent": "Pay"})
    ex.event("tool.requested", {"tool": "charge", "amount": 1234})
    ex.event("ROUTER_DECISION", {"agent": "payer", "score": 4321})
    ex.event("tool.responded", 2.5)
    ex.finish({"status": "paid", "total": 5678})


def cli(data_dir: str, *global_args: str):
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, [*global_args, "--data-dir", data_dir, *args], catch_exceptions=False)

    return run


@pytest.fixture
def stored(data_dir):
    """A closed store holding `record`'s execution, all compacted; its CLI runner."""
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        record(store)
    return cli(data_dir)


def sqlite_change(data_dir: str, sql: str, *args) -> None:
    conn = sqlite3.connect(f"{data_dir}/traces.db")
    with conn:
        assert conn.execute(sql, args).rowcount == 1
    conn.close()


def assert_clean(run) -> None:
    r = run("verify")
    assert r.exit_code == 0, r.output
    assert run("replay", EID).exit_code == 0
    assert "damaged_seqs" not in run("inspect", EID, "--json").stdout


def assert_refused(run, problem: str, changed: str, *, seq=None, column=None) -> None:
    """`verify` exits 4 naming the row, `inspect` and `trace get` read the record as not
    replayable, `record_corrupted`, naming what changed, `replay` refuses it and does not print
    the changed value."""
    r = run("verify")
    assert r.exit_code == 4, r.output
    assert f"problem: {EID}: {problem} does not match its checksum" in r.output
    report = orjson.loads(run("verify", "--json").stdout)
    assert report["ok"] is False and f"{EID}: {problem} does not match its checksum" in report["problems"]
    assert run("verify", EID).exit_code == 4
    view = orjson.loads(run("inspect", EID, "--json").stdout)
    assert (view["replayable"], view["replayable_reason"]) == (False, "record_corrupted")
    assert view.get("damaged_seqs", []) == ([seq] if seq else [])
    assert view.get("damaged_columns", []) == ([column] if column else [])
    got = orjson.loads(run("trace", "get", EID, "--json").stdout)
    assert got["header"]["replayable"] is False
    # Not replayable, record_corrupted: exit 4 (RecordCorruptedError), the code of any damage.
    r = run("replay", EID)
    assert r.exit_code == 4, r.output
    assert "not replayable: record_corrupted" in r.output and changed not in r.output


def test_a_digit_changed_in_a_step_payload_is_found(stored, data_dir):
    assert_clean(stored)
    sqlite_change(data_dir, "UPDATE trace_steps SET payload = replace(payload, '1234', '1294') "
                  "WHERE execution_id = ? AND seq = 2", EID)
    assert_refused(stored, "event seq 2 payload", "1294", seq=2)


def test_a_digit_changed_in_the_final_response_is_found(stored, data_dir):
    sqlite_change(data_dir, "UPDATE traces SET final_response = replace(final_response, '5678', '5679') "
                  "WHERE execution_id = ?", EID)
    assert_refused(stored, "final_response", "5679", column="final_response")


def test_a_changed_router_decision_and_a_changed_bare_number_are_found(stored, data_dir):
    sqlite_change(data_dir, "UPDATE traces SET router_decision = replace(router_decision, '4321', '4322') "
                  "WHERE execution_id = ?", EID)
    assert_refused(stored, "router_decision", "4322", column="router_decision")
    sqlite_change(data_dir, "UPDATE traces SET router_decision = replace(router_decision, '4322', '4321') "
                  "WHERE execution_id = ?", EID)
    sqlite_change(data_dir, "UPDATE trace_steps SET payload = 3.5 WHERE execution_id = ? AND seq = 4", EID)
    assert_refused(stored, "event seq 4 payload", "3.5", seq=4)


def test_store_get_reads_a_changed_value_as_not_replayable(stored, data_dir):
    config = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    with tracedb.open(data_dir, config=config) as store:
        assert store.get(EID).header.replayable is True
    sqlite_change(data_dir, "UPDATE trace_steps SET payload = replace(payload, 'charge', 'chargf') "
                  "WHERE execution_id = ? AND seq = 2", EID)
    with tracedb.open(data_dir, config=config) as store:
        header = store.get(EID).header
        assert (header.replayable, header.replayableReason) == (False, "record_corrupted")
        with pytest.raises(tracedb.NotReplayableError):
            tracedb.ReplayEngine(store.get(EID)).replay()


def _checksums(engine) -> tuple[list, list]:
    with engine.connect() as conn:
        steps = conn.exec_driver_sql("SELECT payload_crc FROM trace_steps ORDER BY seq").scalars().all()
        traces = conn.exec_driver_sql(
            "SELECT router_decision_crc, final_response_crc, meta_crc FROM traces"
        ).all()
    return steps, [tuple(t) for t in traces]


def downgrade(engine, revision: str) -> None:
    """Alembic's downgrade of the store's database to `revision`, as `tracedb.projection.db.migrate` runs
    the upgrades (tracedb itself never goes down)."""
    from alembic import command
    from alembic.config import Config

    from tracedb import migrations

    cfg = Config()
    cfg.set_main_option("script_location", os.path.dirname(os.path.abspath(migrations.__file__)))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def migrated_from_0003(engine, run) -> None:
    """Take the store's database back to revision 0003 (no checksums), open it again (which
    migrates it to the current revision), and check that every row has its checksums: the
    store verifies clean, and a changed value is still found."""
    before = _checksums(engine)
    downgrade(engine, "0003")
    assert db.current_revision(engine) == "0003"
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("trace_steps")}
    assert "payload_crc" not in columns
    assert_clean(run)  # a read command opens the store: the schema is migrated first
    assert db.current_revision(engine) == db.HEAD_REVISION
    assert _checksums(engine) == before


def test_a_store_at_revision_0003_gets_checksums_for_its_rows(stored, data_dir):
    engine = db.create_engine(f"{data_dir}/traces.db", write=True)
    try:
        migrated_from_0003(engine, stored)
    finally:
        engine.dispose()
    sqlite_change(data_dir, "UPDATE trace_steps SET payload = replace(payload, '1234', '1294') "
                  "WHERE execution_id = ? AND seq = 2", EID)
    assert_refused(stored, "event seq 2 payload", "1294", seq=2)
