"""Per-row checksums on PostgreSQL: a value changed in the database is found by `verify` and by
every read of the record; a database at revision 0003 gets checksums for its rows."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import tracedb
from tests.store.test_row_checksums import EID, assert_clean, assert_refused, cli, migrated_from_0003, record


@pytest.fixture
def stored(pg_url, tmp_path):
    """A closed store compacted into this test's schema; its CLI runner."""
    data_dir = str(tmp_path / "data")
    config = {"compact_interval_ms": 0, "idle_timeout_s": 0, "db_url": pg_url}
    with tracedb.open(data_dir, config=config) as store:
        record(store)
    return cli(data_dir, "--db", pg_url)


def pg_change(engine, sql: str) -> None:
    with engine.begin() as conn:
        assert conn.execute(sa.text(sql), {"eid": EID}).rowcount == 1


def test_a_digit_changed_in_a_step_payload_is_found(stored, pg_engine):
    assert_clean(stored)
    pg_change(pg_engine, "UPDATE trace_steps SET payload = replace(payload::text, '1234', '1294')::json "
              "WHERE execution_id = :eid AND seq = 2")
    assert_refused(stored, "event seq 2 payload", "1294", seq=2)


def test_a_digit_changed_in_the_final_response_is_found(stored, pg_engine):
    pg_change(pg_engine, "UPDATE traces SET final_response = replace(final_response::text, '5678', '5679')::json "
              "WHERE execution_id = :eid")
    assert_refused(stored, "final_response", "5679", column="final_response")


def test_a_space_added_to_a_payload_is_found(stored, pg_engine):
    # json keeps the text as written: a change that leaves the value equal is a change too.
    pg_change(pg_engine, "UPDATE trace_steps SET payload = replace(payload::text, ':', ': ')::json "
              "WHERE execution_id = :eid AND seq = 1")
    assert_refused(stored, "event seq 1 payload", "Pay\": ", seq=1)


def test_a_database_at_revision_0003_gets_checksums_for_its_rows(stored, pg_engine):
    migrated_from_0003(pg_engine, stored)
    pg_change(pg_engine, "UPDATE trace_steps SET payload = replace(payload::text, '1234', '1294')::json "
              "WHERE execution_id = :eid AND seq = 2")
    assert_refused(stored, "event seq 2 payload", "1294", seq=2)
