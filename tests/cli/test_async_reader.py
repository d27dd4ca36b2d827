"""The asyncio read API answers what the sync one does, without blocking the event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

import tracedb
from tracedb.config import load_config
from tracedb.reads.reader import AsyncReader, Filter, Reader

from tests.conftest import FakeClock

from .conftest import ENVELOPE, EVENTS, settings


@pytest.fixture
def store_of_many(data_dir):
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        for i in range(7):
            clock.ns += 10**9
            ex = store.start("ProcessIntent" if i % 2 else "Other", ENVELOPE, f"exec-{i:02d}")
            for e in EVENTS[:3]:
                clock.ns += 10**6
                ex.event(*e)
            if i != 3:
                ex.finish({"status": "success", "payload": {"i": i}})
    return data_dir


def test_async_pages_records_and_prefixes_match_the_sync_reader(store_of_many):
    cfg = load_config(overrides={"data_dir": store_of_many})

    async def read():
        async with await AsyncReader.open(cfg) as r:
            first = await r.page(limit=3)
            second = await r.page(before=first.next_cursor, limit=3)
            filtered = await r.page(Filter(intent="Other"), limit=10)
            record = await r.get("exec-05")
            timeline = await r.timeline("exec-0")  # ambiguous: exec-00 .. exec-06
            return first, second, filtered, record, timeline

    with pytest.raises(tracedb.TraceDBError) as ambiguous:
        asyncio.run(read())
    assert ambiguous.value.exit_code == 2

    async def read_ok():
        async with await AsyncReader.open(cfg) as r:
            first = await r.page(limit=3)
            second = await r.page(before=first.next_cursor, limit=3)
            filtered = await r.page(Filter(intent="Other"), limit=10)
            return first, second, filtered, await r.get("exec-05"), await r.timeline("exec-03")

    first, second, filtered, record, timeline = asyncio.run(read_ok())
    with Reader.open(cfg) as sync:
        assert first == sync.page(limit=3)
        assert second == sync.page(before=first.next_cursor, limit=3)
        assert record == sync.get("exec-05")
        assert timeline == sync.timeline("exec-03")
    assert [i.execution_id for i in first.items] == ["exec-06", "exec-05", "exec-04"]
    assert [i.execution_id for i in second.items] == ["exec-03", "exec-02", "exec-01"]
    assert [i.execution_id for i in filtered.items] == ["exec-06", "exec-04", "exec-02", "exec-00"]
    assert record.finalResponse == {"status": "success", "payload": {"i": 5}}
    assert timeline.record.status == "incomplete" and len(timeline.event_times) == 3


def test_reads_neither_wait_for_a_writer_nor_block_the_loop(store_of_many):
    # A writer holds SQLite's write lock (a compaction, `tracedb prune`). Reads in WAL mode go on:
    # opening a reader takes no lock, so with a 50 ms busy timeout a wait would fail the read.
    # The loop's other tasks keep being scheduled while queries run in aiosqlite's thread.
    import sqlite3

    cfg = load_config(overrides={"data_dir": store_of_many, "busy_timeout_ms": 50})
    writer = sqlite3.connect(cfg.sqlite_path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0)

    async def read():
        t = asyncio.create_task(ticker())
        try:
            async with await AsyncReader.open(cfg) as r:
                for _ in range(20):
                    await r.page(limit=5)
        finally:
            t.cancel()

    try:
        with Reader.open(cfg) as sync:
            assert len(sync.page(limit=5).items) == 5
        asyncio.run(read())
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert len(ticks) > 20  # the ticker ran between the reads, not only after them


def test_the_async_reader_refuses_to_write(store_of_many):
    import sqlalchemy as sa

    cfg = load_config(overrides={"data_dir": store_of_many})

    async def write():
        r = await AsyncReader.open(cfg)
        try:
            async with r._engine.begin() as conn:
                await conn.execute(sa.text("DELETE FROM traces"))
        finally:
            await r.close()

    with pytest.raises(sa.exc.OperationalError, match="readonly|read-only|query_only"):
        asyncio.run(write())
    with Reader.open(cfg) as sync:
        assert len(sync.page(limit=100).items) == 7


def test_a_missing_store_is_not_found_not_created(tmp_path):
    cfg = load_config(overrides={"data_dir": str(tmp_path / "nothing")})
    with pytest.raises(tracedb.StoreNotFoundError):
        asyncio.run(AsyncReader.open(cfg))
    assert not (tmp_path / "nothing").exists()
