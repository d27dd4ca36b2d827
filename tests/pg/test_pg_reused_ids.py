"""The WAL of an execution id reused after `prune`, compacted again into a new PostgreSQL
schema: the newer execution replaces the earlier one there too (tests/store/test_reused_ids.py)."""

from __future__ import annotations

import pytest

import tracedb
from tests.store.conftest import FakeClock
from tests.store.test_reused_ids import assert_second_only, record_reused_id


@pytest.mark.parametrize("batch", [1, 5, 1000])
def test_a_fresh_schema_gets_the_newer_execution_of_a_reused_id(tmp_path, pg_url, batch):
    clock = FakeClock()
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    data_dir = str(tmp_path / "data")
    with tracedb.open(data_dir, config=settings, clock=clock) as store:
        record_reused_id(store, clock)
    # The same WAL, from LSN 1, into a schema that holds nothing yet.
    with tracedb.open(data_dir, config={**settings, "db_url": pg_url, "compact_batch_records": batch}, clock=clock) as store:
        assert_second_only(store)
