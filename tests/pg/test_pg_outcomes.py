"""The derived outcome columns on PostgreSQL: the compactor's fold record by record and in one
batch, and migration 0005's backfill of a database at revision 0004, agree."""

from __future__ import annotations

import tracedb
from tests.store.test_outcomes import check_filters_and_stats, check_mix, check_percentiles, record_mix, rows
from tests.store.test_row_checksums import downgrade
from tracedb.projection import db


def test_the_fold_and_the_backfill_agree_on_postgresql(pg_url, pg_engine, tmp_path):
    config = {"compact_interval_ms": 0, "idle_timeout_s": 0, "db_url": pg_url, "compact_batch_records": 1}
    with tracedb.open(str(tmp_path / "data"), config=config) as store:
        ids = record_mix(store)
        store.compact()
        check_mix(rows(pg_engine), ids)
    live = rows(pg_engine)
    downgrade(pg_engine, "0004")
    db.migrate(pg_engine)
    assert rows(pg_engine) == live
    assert live[ids["running"]]["outcome"] == "incomplete"


def test_filters_and_stats_in_sql_on_postgresql(pg_url, tmp_path):
    from tracedb.config import load_config
    from tracedb.reads.reader import Reader

    config = {"compact_interval_ms": 0, "idle_timeout_s": 0, "db_url": pg_url}
    with tracedb.open(str(tmp_path / "data"), config=config) as store:
        ids = record_mix(store)
    with Reader.open(load_config(overrides={"data_dir": str(tmp_path / "data"), "db_url": pg_url})) as reader:
        check_filters_and_stats(reader, ids)


def test_stats_percentiles_are_exact_on_postgresql(pg_engine):
    check_percentiles(pg_engine)


def test_a_page_of_a_common_model_walks_the_newest_first_index_on_postgresql(pg_engine):
    """Migration 0010's statistics: the planner knows how many rows `--model` keeps, and reads a
    page of a model most executions call newest first off ix_traces_created_id, instead of
    scanning the table and sorting it (it guessed 0.5% of rows without them)."""
    import sqlalchemy as sa

    from tracedb.projection import db

    db.migrate(pg_engine)
    with pg_engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO traces (execution_id, recorder_id, intent, status, replayable, envelope, envelope_hash, "
            "last_seq, created_at_ns, updated_at_ns, pinned, outcome, models) SELECT 'e' || i, 'r', 'I', "
            "'completed', true, '{}', 'h', 1, i, i, false, 'succeeded', "
            "CASE WHEN i % 10 = 0 THEN '[\"rare\"]' ELSE '[\"gpt-4o\"]' END::json FROM generate_series(1, 20000) AS i"))
    with pg_engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE traces")
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(
            "EXPLAIN SELECT execution_id FROM traces WHERE CAST(traces.models AS TEXT) LIKE '%%' || %s || '%%' "
            "ESCAPE '/' ORDER BY created_at_ns DESC, execution_id DESC LIMIT 51", ('"gpt-4o"',)))
    assert "Index Scan Backward using ix_traces_created_id" in plan, plan
