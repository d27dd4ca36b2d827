"""verify in chunks and prune in batches on PostgreSQL: the same answers as on SQLite whatever
the chunk or batch size (tests/store/streaming_scenarios.py)."""

from __future__ import annotations

import pytest

from tests.store.streaming_scenarios import (
    DAY,
    VERIFY_IDS,
    forks_without_parent,
    plant_lifecycle_problems,
    plant_trace_problems,
    record_retention_store,
    record_verify_store,
    stored_ids,
    walk_problems,
)
from tracedb.maintenance.verify import verify

from .conftest import FakeClock

pytestmark = pytest.mark.postgres


def test_verify_in_chunks_finds_problems_in_the_first_and_last_chunk(open_pg_store):
    store = open_pg_store()
    n_steps = record_verify_store(store)
    for chunk in (1, 3, 5, 10, 1000):
        clean = verify(store.engine, chunk_traces=chunk)
        assert clean.ok and (clean.checked_traces, clean.checked_steps) == (len(VERIFY_IDS), n_steps)
    expected = plant_trace_problems(store.engine)
    for chunk in (1, 3, 4, 5, 10, 11, 1000):
        result = verify(store.engine, chunk_traces=chunk)
        assert walk_problems(result) == expected, chunk
        assert (result.checked_traces, result.checked_steps) == (len(VERIFY_IDS), n_steps - 1)


def test_verify_in_chunks_reports_every_kind_of_problem_in_order(open_pg_store):
    store = open_pg_store()
    record_verify_store(store)
    expected, n_steps = plant_lifecycle_problems(store.engine)
    for chunk in (1, 3, 1000):
        result = verify(store.engine, chunk_traces=chunk)
        assert walk_problems(result) == expected, chunk
        assert (result.checked_traces, result.checked_steps) == (len(VERIFY_IDS), n_steps)
    assert [p for eid in VERIFY_IDS for p in store.verify(eid).problems] == expected


@pytest.mark.parametrize("batch", [1, 3, 500])
def test_prune_in_batches_keeps_pins_and_fork_parents_on_postgresql(open_pg_store, batch):
    clock = FakeClock()
    store = open_pg_store(clock=clock, prune_batch_traces=batch)
    want = record_retention_store(store, clock)
    counts = (len(want["deleted"]), want["deleted_steps"], want["kept_pinned"], want["kept_parents"])
    dry = store.prune(older_than_s=30 * DAY, dry_run=True)
    assert (dry.deleted_traces, dry.deleted_steps, dry.kept_pinned, dry.kept_parents) == counts
    orphaned = []
    result = store.prune(
        older_than_s=30 * DAY, progress=lambda done, total: orphaned.extend(forks_without_parent(store.engine))
    )
    assert (result.deleted_traces, result.deleted_steps, result.kept_pinned, result.kept_parents) == counts
    assert result.bytes_freed >= 0
    assert stored_ids(store.engine) == want["kept"]
    assert orphaned == []
    assert store.verify().ok


def test_prune_analyzes_the_tables_the_planner_has_no_row_count_for(open_pg_store):
    # A database loaded minutes ago, before autovacuum's first ANALYZE: without row counts the
    # planner deletes each batch's steps with a sequential scan of trace_steps. A dry run, which
    # vacuums nothing, shows that prune gathered them before its walk.
    clock = FakeClock()
    store = open_pg_store(clock=clock)
    record_retention_store(store, clock)

    def row_counts():
        with store.engine.connect() as conn:
            return dict(conn.exec_driver_sql(
                "SELECT relname, reltuples FROM pg_class "
                "WHERE oid IN ('traces'::regclass, 'trace_steps'::regclass)").all())

    if min(row_counts().values()) >= 0:
        pytest.skip("autovacuum analyzed the new tables first")
    store.prune(older_than_s=30 * DAY, dry_run=True)
    counts = row_counts()
    assert counts["traces"] > 0 and counts["trace_steps"] > 0, counts
