"""A listing shows what `inspect ID` shows: a record whose envelope was changed in the database
is not replayable, `record_corrupted`, in `inspect --list` (table, JSON) and in the read API's
pages, and a `replayable=True` page leaves it out. (That a listing loads neither SQLAlchemy nor
pydantic: tests/cli/test_sqlite_reads.py.)"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import orjson
import pytest

import tracedb
from tracedb.config import load_config
from tracedb.reads.reader import Filter, Reader

from tests.conftest import FakeClock

from .conftest import ENVELOPE, EVENTS, settings

pytestmark = pytest.mark.timeout(120)
TAMPERED = "exec-02"


@pytest.fixture
def tampered(data_dir):
    """Five completed executions, exec-00 (oldest) .. exec-04; exec-02's envelope then changed
    by one byte in the database."""
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        for i in range(5):
            clock.ns += 10**9
            ex = store.start("ProcessIntent", ENVELOPE, f"exec-{i:02d}")
            ex.event(*EVENTS[0])
            ex.finish({"status": "success"})
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as db:
        n = db.execute("UPDATE traces SET envelope = replace(envelope, 'invoice-17', 'invoice-18') "
                       "WHERE execution_id = ?", (TAMPERED,)).rowcount
    assert n == 1
    return data_dir


def _replay_column(table: str) -> dict:
    return {line.split()[0]: line.split()[4] for line in table.splitlines() if line.startswith("exec-")}


def test_the_listing_judges_each_row_as_inspect_does(tampered, run):
    shown = orjson.loads(run("inspect", TAMPERED, "--json").stdout)
    assert shown["replayable"] is False and shown["replayable_reason"] == "record_corrupted"

    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", tampered, "inspect", "--list"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _replay_column(r.stdout) == {
        "exec-04": "replayable", "exec-03": "replayable", TAMPERED: "not-replayable",
        "exec-01": "replayable", "exec-00": "replayable",
    }
    listed = {row["execution_id"]: row for row in orjson.loads(run("inspect", "--list", "--json").stdout)}
    assert (listed[TAMPERED]["replayable"], listed[TAMPERED]["replayable_reason"]) == (False, "record_corrupted")
    assert all(row["replayable"] for eid, row in listed.items() if eid != TAMPERED)


def test_a_replayable_page_leaves_a_corrupted_record_out_and_still_fills(tampered):
    with Reader.open(load_config(overrides={"data_dir": tampered})) as reader:
        seen, before = [], None
        while True:
            page = reader.page(Filter(replayable=True), before=before, limit=2)
            assert len(page.items) == 2 or page.next_cursor is None
            seen += [i.execution_id for i in page.items]
            if page.next_cursor is None:
                break
            before = page.next_cursor
        assert seen == ["exec-04", "exec-03", "exec-01", "exec-00"]
        not_replayable = reader.page(Filter(replayable=False)).items
        assert all(not i.replayable for i in not_replayable)
        # The stored flags, for a caller that reads each record anyway.
        assert next(i for i in reader.page(judge=False).items if i.execution_id == TAMPERED).replayable


def test_a_replayable_page_past_many_corrupted_records_is_short_and_continues(data_dir):
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        for i in range(25):
            clock.ns += 10**9
            store.start("ProcessIntent", ENVELOPE, f"exec-{i:02d}").finish({"status": "success"})
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as db:
        db.execute("UPDATE traces SET envelope = replace(envelope, 'invoice-17', 'invoice-18') "
                   "WHERE execution_id != 'exec-00'")
    with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
        first = reader.page(Filter(replayable=True), limit=1)
        assert first.items == () and first.next_cursor is not None  # REFILLS reads of 2 rows: 16 rows
        rest = reader.page(Filter(replayable=True), before=first.next_cursor, limit=1)
        assert [i.execution_id for i in rest.items] == ["exec-00"] and rest.next_cursor is None
