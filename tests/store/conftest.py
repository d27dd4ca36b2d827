"""Fixtures for the store tests: a fake clock, stores opened in tmp_path and closed afterwards."""

from __future__ import annotations

import functools
import os

import pytest

import tracedb
from tracedb.maintenance import retention
from tests.children import Child, killed_after
from tests.conftest import SEED_002, FakeClock  # noqa: F401 - re-exported: tests/pg imports it from here

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")

# Seed 002's example event sequence; FINAL_RESPONSE is recorded by finish().
SEED_002_EVENTS = [
    *((seq, t, p) for seq, (t, p) in enumerate(SEED_002, 1)),
    (8, "FINAL_RESPONSE", {"status": "success"}),
]
ENVELOPE = {
    "intent": "ProcessIntent",
    "payload": {"document": "invoice-17"},
    "routingMetadata": {"hop": 3},
}


@pytest.fixture
def open_store(data_dir, clock):
    """open_store(**settings) -> Store on data_dir with the fake clock; closed at teardown.

    The background thread is off unless a test asks for it: tests drive compaction themselves.
    """
    opened = []

    def _open(path=None, **settings):
        settings.setdefault("compact_interval_ms", 0)
        settings.setdefault("idle_timeout_s", 0)
        store = tracedb.open(path or data_dir, config=settings, clock=clock)
        opened.append(store)
        return store

    yield _open
    for s in opened:
        s.close()


def record_seed_002(store, execution_id="exec-a1b2c3d4", envelope=None):
    """Record seed 002's example execution; returns the Execution."""
    ex = store.start("ProcessIntent", envelope or ENVELOPE, execution_id)
    for seq, type_, payload in SEED_002_EVENTS[:-1]:
        assert ex.event(type_, payload) == seq
    assert ex.finish(SEED_002_EVENTS[-1][2]) == 8
    return ex


def invalidated_in_the_database(store):
    """An execution with one event, compacted, then invalidated in the database directly, as
    `tracedb invalidate` next to a running recorder does; the Execution."""
    ex = store.start("X", {})
    ex.event("tool.requested", {"n": 1})
    store.compact()
    assert retention.invalidate_in_db(store.engine, ex.execution_id, "bad agent", store.clock())
    return ex


def assert_compaction_skips_a_pruned_trace(store, clock) -> None:
    """An execution invalidated in the database and pruned while the recorder still held it: its
    late event is skipped by compaction (the UPDATE of the pruned trace misses: record by record
    then), and another execution's event is compacted."""
    ex = store.start("X", {})
    store.compact()
    retention.invalidate_in_db(store.engine, ex.execution_id, "gone", clock())
    clock.advance(10)
    assert store.prune(older_than_s=1).deleted_traces == 1
    ex.event("tool.requested", {"late": True})  # accepted before the recorder noticed
    other = store.start("Y", {})
    other.event("tool.requested", {})
    assert store.compact().skipped_records == 1
    assert [e.seq for e in store.get(other.execution_id).events] == [1]
    assert store.verify().ok


@pytest.fixture
def child(data_dir):
    """child(*args, pause=None) -> Child running child.py on data_dir; killed at teardown."""
    with killed_after(functools.partial(Child, CHILD, data_dir)) as start:
        yield start
