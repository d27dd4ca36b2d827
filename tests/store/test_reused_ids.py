"""An execution id started again after `prune` deleted its first execution: compacting the whole
WAL again into a new database (a rebuild, or a database file removed) gives what the live store
held, the newer execution alone, however the records fall into batches."""

from __future__ import annotations

import os

import pytest

from tracedb.maintenance import retention


def record_reused_id(store, clock) -> None:
    first = store.start("J", {"run": "first"}, "job-1")
    for i in range(3):
        first.event("tool.requested", {"run": "first", "i": i})
    first.finish({"answer": "first"})
    store.compact()
    clock.advance(10)
    assert retention.prune(store.engine, older_than_s=1, now_ns=clock()).deleted_traces == 1
    store.compact()  # the recorder forgets what it compacted: the id is free again
    second = store.start("J", {"run": "second"}, "job-1")
    second.event("tool.requested", {"run": "second", "i": 0})
    second.finish({"answer": "second"})
    other = store.start("K", {}, "job-2")  # after the reused id, in the same batches
    other.event("tool.requested", {"n": 1})


def assert_second_only(store) -> None:
    rec = store.get("job-1")
    assert rec.envelope == {"run": "second"}
    assert [(e.seq, e.payload) for e in rec.events] == [(1, {"run": "second", "i": 0}), (2, {"answer": "second"})]
    assert (rec.status, rec.header.replayable, rec.finalResponse) == ("completed", True, {"answer": "second"})
    assert [e.seq for e in store.get("job-2").events] == [1]
    assert store.verify().ok


@pytest.mark.parametrize("batch", [1, 3, 5, 6, 1000])
def test_a_fresh_database_gets_the_newer_execution_of_a_reused_id(open_store, data_dir, clock, batch):
    store = open_store()
    record_reused_id(store, clock)
    assert_second_only(store)
    store.close()
    for suffix in ("", "-wal", "-shm"):
        path = os.path.join(data_dir, "traces.db" + suffix)
        if os.path.exists(path):
            os.remove(path)
    assert_second_only(open_store(compact_batch_records=batch))


def test_reads_of_a_restored_database_show_the_newer_execution_the_wal_holds(open_store, data_dir, clock, tmp_path):
    """The database restored from before a reused id's second start, no recorder running: the
    reads fold in the WAL's newer execution and leave out the earlier one's stored steps."""
    import asyncio
    import shutil

    from tracedb.config import load_config
    from tracedb.reads.reader import AsyncReader, Reader

    store = open_store()
    first = store.start("J", {"run": "first"}, "job-1")
    for i in range(3):
        first.event("tool.requested", {"run": "first", "i": i})
    first.finish({"answer": "first"})
    store.compact()
    saved = tmp_path / "saved"
    shutil.copytree(data_dir, saved, dirs_exist_ok=True, ignore=shutil.ignore_patterns("wal", "LOCK", "*.sock"))
    clock.advance(10)
    assert retention.prune(store.engine, older_than_s=1, now_ns=clock()).deleted_traces == 1
    store.compact()
    second = store.start("J", {"run": "second"}, "job-1")
    second.event("tool.requested", {"run": "second", "i": 0})
    second.finish({"answer": "second"})
    store.close()
    for suffix in ("", "-wal", "-shm"):  # the database as it was before the second start
        path = os.path.join(data_dir, "traces.db" + suffix)
        if os.path.exists(path):
            os.remove(path)
        if os.path.exists(saved / ("traces.db" + suffix)):
            shutil.copy(saved / ("traces.db" + suffix), path)

    config = load_config(overrides={"data_dir": data_dir})
    want = [(1, "tool.requested", {"run": "second", "i": 0}), (2, "FINAL_RESPONSE", {"answer": "second"})]
    with Reader.open(config) as reader:
        assert "job-1" in reader.pending.replaced
        rec = reader.get("job-1")
        assert rec.envelope == {"run": "second"} and rec.finalResponse == {"answer": "second"}
        assert [(e.seq, e.type, e.payload) for e in rec.events] == want
        assert [(e.seq, e.type, e.payload) for e in reader.progress("job-1").events] == want
        assert reader.event("job-1", 1).payload == {"run": "second", "i": 0}

    async def read_async():
        reader = await AsyncReader.open(config)
        try:
            progress = await reader.progress("job-1")
            return [(e.seq, e.type, e.payload) for e in progress.events], (await reader.event("job-1", 1)).payload
        finally:
            await reader.close()

    events, one = asyncio.run(read_async())
    assert events == want and one == {"run": "second", "i": 0}
