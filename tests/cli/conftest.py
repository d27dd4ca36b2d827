"""Fixtures for the CLI tests: a data directory with seed 002's executions in it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import tracedb
from tests.conftest import SEED_002, T0_NS, FakeClock
from tests.other_user import nobody  # noqa: F401 - the fixture, for the tests of this folder
from tracedb.cli import main
from tracedb.reads.reader import Filter

ENVELOPE = {"intent": "ProcessIntent", "payload": {"document": "invoice-17"}}
EVENTS = SEED_002


def record_processor_run(store, clock: FakeClock, eid: str, envelope: dict = ENVELOPE) -> None:
    """One execution `eid`, a second after the last: SEED_002's events (none for "finish-only"),
    then a successful finish."""
    clock.ns += 10**9
    ex = store.start("ProcessIntent", envelope, eid)
    if eid != "finish-only":
        for e in EVENTS:
            ex.event(*e)
    ex.finish({"status": "success", "metadata": {"agent": "processor-b"}})
T0 = T0_NS  # where FakeClock starts


def settings(**kw):
    kw.setdefault("compact_interval_ms", 0)
    kw.setdefault("idle_timeout_s", 0)
    return kw


@pytest.fixture
def seeded(data_dir):
    """Seed 002's two executions: exec-a1b2c3d4 completed at 10:30:00, exec-e5f6g7h8 cut off
    after AGENT_ATTEMPT_START at 10:31:00 (its recorder went away)."""
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        ex = store.start("ProcessIntent", ENVELOPE, "exec-a1b2c3d4")
        for e in EVENTS:
            ex.event(*e)
        ex.finish({"status": "success"})
        clock.ns += 60 * 10**9
        ex = store.start("ProcessIntent", ENVELOPE, "exec-e5f6g7h8")
        ex.event(*EVENTS[0])
        ex.event(*EVENTS[1])
        ex.event("AGENT_ATTEMPT_START", {"agent": "processor-a"})
    return data_dir


@pytest.fixture
def run(data_dir):
    runner = CliRunner()

    def _run(*args, **kw):
        return runner.invoke(main, ["--data-dir", data_dir, *args], catch_exceptions=False, **kw)

    return _run


def page_queries(reader) -> list:
    """(sql, parameters) of three pages as the reader runs them: the first, the next one, the next
    one of completed executions; to EXPLAIN on the reader's database."""
    statements = []

    def record(conn, cursor, sql, params, context, executemany):
        if "FROM traces" in sql and "ORDER BY" in sql:
            statements.append((sql, params))

    sa.event.listen(reader.engine, "before_cursor_execute", record)
    try:
        cursor = reader.page(limit=5).next_cursor
        reader.page(limit=5, before=cursor)
        reader.page(Filter(status="completed"), limit=5, before=cursor)
    finally:
        sa.event.remove(reader.engine, "before_cursor_execute", record)
    return statements
