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
