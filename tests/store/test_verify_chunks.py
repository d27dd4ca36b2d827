"""verify walks the store in chunks of traces: whatever the chunk size, it checks every trace and
step once and finds every problem, in the first chunk, the last, and on a chunk's boundary."""

from __future__ import annotations

import sqlite3

import pytest

from tracedb.maintenance import verify as verify_module
from tracedb.maintenance.verify import verify

from .streaming_scenarios import (
    ORPHANS,
    VERIFY_IDS,
    merge_orphans,
    plant_lifecycle_problems,
    plant_trace_problems,
    record_verify_store,
    walk_problems,
)

CHUNKS = [1, 2, 3, 4, 5, 9, 10, 11, 1000]


def plant_orphan_steps(db_path: str) -> None:
    """Steps whose trace does not exist: only possible with foreign keys off (a damaged store)."""
    conn = sqlite3.connect(db_path)  # foreign_keys is off on a connection of its own
    with conn:
        for eid in ORPHANS:
            conn.execute(
                "INSERT INTO trace_steps (execution_id, seq, type, payload, recorded_at_ns, lsn) "
                "VALUES (?, 1, 'tool.requested', '{}', 1, 1)",
                (eid,),
            )
    conn.close()


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_clean_store_is_ok_in_chunks_of_any_size(open_store, chunk):
    store = open_store()
    n_steps = record_verify_store(store)
    result = verify(store.engine, chunk_traces=chunk)
    assert result.ok, result.problems
    assert (result.checked_traces, result.checked_steps) == (len(VERIFY_IDS), n_steps)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_problems_in_the_first_and_last_chunk_and_on_a_boundary_are_found(open_store, chunk):
    store = open_store()
    n_steps = record_verify_store(store)
    expected = plant_trace_problems(store.engine)
    plant_orphan_steps(store.config.sqlite_path)
    result = verify(store.engine, chunk_traces=chunk)
    assert walk_problems(result) == merge_orphans(expected)
    # Orphans are reported, not counted as checked steps of a trace.
    assert (result.checked_traces, result.checked_steps) == (len(VERIFY_IDS), n_steps - 1)
    # The database's own check still runs after the walk, and sees the orphans too.
    assert any(p.startswith("sqlite foreign_key_check") for p in result.problems)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_every_kind_of_problem_is_reported_in_order(open_store, monkeypatch, chunk):
    store = open_store()
    record_verify_store(store)
    expected, n_steps = plant_lifecycle_problems(store.engine)
    monkeypatch.setattr(verify_module, "CHUNK_TRACES", chunk)
    result = store.verify()
    assert walk_problems(result) == expected
    assert (result.checked_traces, result.checked_steps) == (len(VERIFY_IDS), n_steps)
    # One execution at a time, the same problems.
    one_by_one = [p for eid in VERIFY_IDS for p in store.verify(eid).problems]
    assert one_by_one == expected


def test_steps_after_a_last_chunk_that_is_full_are_reported(open_store):
    # 10 traces in chunks of 5: the second chunk is full, so a third (empty) one must still
    # look for steps after the last trace.
    store = open_store()
    record_verify_store(store)
    plant_orphan_steps(store.config.sqlite_path)
    problems = walk_problems(verify(store.engine, chunk_traces=5))
    assert problems == [f"{o}: step 1 has no trace" for o in ORPHANS]


def test_the_store_and_the_cli_walk_in_chunks_too(open_store, monkeypatch):
    store = open_store()
    record_verify_store(store)
    expected = plant_trace_problems(store.engine)
    monkeypatch.setattr(verify_module, "CHUNK_TRACES", 3)
    result = store.verify()
    assert walk_problems(result) == expected
    # One execution: its own checks, not the chunked walk.
    assert store.verify(VERIFY_IDS[-1]).problems == (expected[-1],)
    assert store.verify(VERIFY_IDS[1]).ok


def test_an_empty_store_verifies(open_store):
    store = open_store()
    store.compact()
    result = verify(store.engine, chunk_traces=2)
    assert (result.ok, result.checked_traces, result.checked_steps) == (True, 0, 0)
