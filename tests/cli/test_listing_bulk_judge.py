"""A page of a SQLite store is judged in bulk (its rows' `traces` values and steps read by two
queries, payloads checked as text, never decoded), and each row's verdict is the one
`inspect ID` gives: the same (replayable, reason) as its record judged whole, and as a page read
through SQLAlchemy (`tracedb.reads.sql.judged_rows`, as on PostgreSQL). Over every kind of damage
a row can carry."""

from __future__ import annotations

import os
import sqlite3

import pytest

import tracedb
from tracedb.projection import db
from tracedb.reads import sqlite as sqlite_reads
from tracedb.projection.checksums import of_stored
from tracedb.config import load_config
from tracedb.reads.reader import Reader

from tests.conftest import FakeClock

from .conftest import ENVELOPE, EVENTS, record_processor_run, settings

pytestmark = pytest.mark.timeout(120)

REDACTING = """
[compaction]
interval_ms = 0

[recovery]
idle_timeout_s = 0

[redaction]
keys = ["password"]
"""

# What is done to each execution in traces.db, and whether its record then fails verification.
DAMAGE = {
    "clean-1": ([], False),
    "clean-2": ([], False),
    "envelope-byte": (["UPDATE traces SET envelope = replace(envelope, 'invoice-17', 'invoice-18') WHERE execution_id = ?"], True),
    "payload-byte": (["UPDATE trace_steps SET payload = replace(payload, 'processor-a', 'processor-x') "
                      "WHERE execution_id = ? AND seq = 2"], True),
    "final-response": (["UPDATE traces SET final_response = replace(final_response, 'success', 'failure') "
                        "WHERE execution_id = ?"], True),
    "router-decision": (["UPDATE traces SET router_decision = replace(router_decision, 'processor-b', 'processor-c') "
                         "WHERE execution_id = ?"], True),
    "step-deleted": (["DELETE FROM trace_steps WHERE execution_id = ? AND seq = 3"], True),
    "meta": (["UPDATE traces SET meta = json_object('imported', 1) WHERE execution_id = ?"], True),
    # The stored envelope's hash in meta changed, its checksum made to match: the envelope no longer
    # hashes to the hash meta gives, which only the envelope rule finds.
    "redacted-meta-hash": (["UPDATE traces SET meta = json_set(meta, '$.redaction.envelopeHash', 'sha256:' || "
                            "printf('%064d', 0)) WHERE execution_id = ?", "CRC"], True),
    "stored-corrupted": (["UPDATE traces SET replayable = 0, replayable_reason = 'record_corrupted' "
                          "WHERE execution_id = ?"], True),
    "last-step-deleted": (["DELETE FROM trace_steps WHERE execution_id = ?1 AND seq = "
                           "(SELECT max(seq) FROM trace_steps WHERE execution_id = ?1)"], False),
    "finish-only": ([], False),
}


def _meta_crc(conn: sqlite3.Connection, eid: str) -> None:
    (meta,) = conn.execute("SELECT meta FROM traces WHERE execution_id = ?", (eid,)).fetchone()
    conn.execute("UPDATE traces SET meta_crc = ? WHERE execution_id = ?", (of_stored(meta), eid))


@pytest.fixture
def damaged(tmp_path, data_dir):
    """One execution per kind of damage (and clean ones, one cut off while running)."""
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        for eid in DAMAGE:
            if eid != "redacted-meta-hash":
                record_processor_run(store, clock, eid)
        ex = store.start("ProcessIntent", ENVELOPE, "running")
        ex.event(*EVENTS[0])
    config = tmp_path / "redacting.toml"
    config.write_text(REDACTING)
    with tracedb.open(data_dir, config=str(config), clock=clock) as store:
        record_processor_run(store, clock, "redacted-meta-hash", {**ENVELOPE, "auth": {"password": "hunter2"}})
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as conn:
        for eid, (statements, _) in DAMAGE.items():
            for sql in statements:
                if sql == "CRC":
                    _meta_crc(conn, eid)
                else:
                    assert conn.execute(sql, (eid,)).rowcount == 1, (eid, sql)
    return data_dir


def _verdicts(items) -> dict:
    return {i.execution_id: (i.replayable, i.replayable_reason) for i in items}


def test_a_bulk_verdict_is_the_verdict_of_the_whole_record(damaged):
    cfg = load_config(overrides={"data_dir": damaged})
    statements: list[str] = []
    conn = sqlite_reads.connect(cfg.database)
    conn.set_trace_callback(statements.append)
    with Reader(None, config=cfg, connection=conn) as reader:
        bulk = _verdicts(reader.page(limit=100).items)
        # Two statements of the traces table and steps, in one snapshot, for the whole page.
        judging = [s for s in statements if "payload_crc" in s and "seq" in s]
        assert len(judging) == 1, statements
        whole = {eid: (r.header.replayable, r.header.replayableReason)
                 for eid, r in ((eid, reader.get(eid)) for eid in bulk)}
    engine = db.open_store_engine(cfg.database)
    try:
        through_engine = _verdicts(Reader(engine).page(limit=100).items)
    finally:
        engine.dispose()

    assert set(bulk) == {*DAMAGE, "running"}
    assert bulk == whole == through_engine
    corrupted = {eid for eid, (_, reason) in bulk.items() if reason == "record_corrupted"}
    assert corrupted == {eid for eid, (_, bad) in DAMAGE.items() if bad}
    assert all(not replayable for eid, (replayable, _) in bulk.items() if eid in corrupted)
    assert bulk["running"] == (False, "execution_incomplete")
    assert bulk["clean-1"] == (True, None)


def test_judged_rows_reads_seqs_and_checksums_without_the_payloads(damaged):
    conn = sqlite_reads.connect(os.path.join(damaged, "traces.db"))
    try:
        read = sqlite_reads.judged_rows(conn, ["clean-1", "payload-byte", "step-deleted", "meta", "finish-only", "gone"])
    finally:
        conn.close()
    assert set(read) == {"clean-1", "payload-byte", "step-deleted", "meta", "finish-only"}  # "gone" is not stored
    assert (read["clean-1"].seqs, read["clean-1"].steps_intact, read["clean-1"].damaged_columns) == (
        [1, 2, 3, 4, 5, 6, 7, 8], True, [])
    assert read["payload-byte"].steps_intact is False
    assert read["step-deleted"].seqs == [1, 2, 4, 5, 6, 7, 8]
    assert read["meta"].damaged_columns == ["meta"]
    assert (read["finish-only"].seqs, read["finish-only"].steps_intact) == ([1], True)
