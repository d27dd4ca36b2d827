"""A page of a PostgreSQL store is judged in bulk (two queries a page, payloads checked as stored
text; `tracedb.reads.sql.judged_rows`), and each row's verdict is the one `inspect ID` gives for
its whole record, over the kinds of damage a row can carry."""

from __future__ import annotations

import pytest

import tracedb
from tests.cli.conftest import ENVELOPE, EVENTS, record_processor_run
from tests.conftest import FakeClock
from tracedb.config import load_config
from tracedb.reads.reader import Reader

pytestmark = pytest.mark.postgres

# What is done to each execution in the database, and whether its record then fails verification.
DAMAGE = {
    "clean-1": ([], False),
    "clean-2": ([], False),
    "envelope-byte": (["UPDATE traces SET envelope = replace(envelope::text, 'invoice-17', 'invoice-18')::json "
                       "WHERE execution_id = %s"], True),
    "payload-byte": (["UPDATE trace_steps SET payload = replace(payload::text, 'processor-a', 'processor-x')::json "
                      "WHERE execution_id = %s AND seq = 2"], True),
    "final-response": (["UPDATE traces SET final_response = replace(final_response::text, 'success', 'failure')::json "
                        "WHERE execution_id = %s"], True),
    "step-deleted": (["DELETE FROM trace_steps WHERE execution_id = %s AND seq = 3"], True),
    "stored-corrupted": (["UPDATE traces SET replayable = false, replayable_reason = 'record_corrupted' "
                          "WHERE execution_id = %s"], True),
    "finish-only": ([], False),
}


def _verdicts(items) -> dict:
    return {i.execution_id: (i.replayable, i.replayable_reason) for i in items}


def test_a_bulk_verdict_on_postgresql_is_the_verdict_of_the_whole_record(pg_url, pg_engine, tmp_path):
    clock = FakeClock()
    data = str(tmp_path / "data")
    config = {"compact_interval_ms": 0, "idle_timeout_s": 0, "db_url": pg_url}
    with tracedb.open(data, config=config, clock=clock) as store:
        for eid in DAMAGE:
            record_processor_run(store, clock, eid)
        ex = store.start("ProcessIntent", ENVELOPE, "running")
        ex.event(*EVENTS[0])
    raw = pg_engine.raw_connection()
    try:
        with raw.cursor() as cur:
            for eid, (statements, _) in DAMAGE.items():
                for sql in statements:
                    cur.execute(sql, (eid,))
                    assert cur.rowcount == 1, (eid, sql)
        raw.commit()
    finally:
        raw.close()
    with Reader.open(load_config(overrides={"data_dir": data, "db_url": pg_url})) as reader:
        bulk = _verdicts(reader.page(limit=100).items)
        whole = {eid: (r.header.replayable, r.header.replayableReason)
                 for eid, r in ((eid, reader.get(eid)) for eid in bulk)}
        # A page cut in two judges the same.
        first = reader.page(limit=4)
        halves = _verdicts(first.items) | _verdicts(reader.page(before=first.next_cursor, limit=100).items)
    assert set(bulk) == {*DAMAGE, "running"}
    assert bulk == whole == halves
    corrupted = {eid for eid, (_, reason) in bulk.items() if reason == "record_corrupted"}
    assert corrupted == {eid for eid, (_, bad) in DAMAGE.items() if bad}
    assert bulk["running"] == (False, "execution_incomplete")
    assert bulk["clean-1"] == (True, None)
