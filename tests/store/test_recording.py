"""Recording API: seeds 000 and 002's record shape, seq, validation, closed executions, asyncio."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
from datetime import datetime, timezone

import pytest

import tracedb
from tracedb.records.record import compute_envelope_hash

from tests.waiting import wait_until_async

from .conftest import ENVELOPE, SEED_002_EVENTS, record_seed_002


def seed_000_hash(envelope: dict) -> str:
    """Seed 000's compute_envelope_hash, verbatim."""
    stable = {k: v for k, v in envelope.items() if k not in ["routingMetadata"]}
    canonical = json.dumps(stable, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return f"sha256:{hashlib.sha256(canonical.encode()).hexdigest()}"


def test_seed_002_example_sequence_is_read_back_exactly(open_store):
    store = open_store()
    ex = record_seed_002(store)
    record = store.get(ex.execution_id)
    assert [e.to_dict() for e in record.events] == [
        {"seq": s, "type": t, "payload": p} for s, t, p in SEED_002_EVENTS
    ]
    d = record.to_dict()
    assert d["header"] == {
        "executionId": "exec-a1b2c3d4",
        "createdUtcIso": "2024-01-15T10:30:00.000000Z",
        "envelopeHash": seed_000_hash(ENVELOPE),
        "replayable": True,
        "replayableReason": None,
    }
    assert d["envelope"] == ENVELOPE
    assert d["routerDecision"] == {"agent": "processor-b"}
    assert d["finalResponse"] == {"status": "success"}
    assert d["status"] == "completed"
    assert d["intent"] == "ProcessIntent"


def test_envelope_hash_is_seed_000s_and_ignores_routing_metadata(open_store):
    store = open_store()
    env = {"intent": "X", "when": datetime(2024, 1, 15, tzinfo=timezone.utc), "b": [1, 2], "a": "é"}
    ex = store.start("X", env)
    assert ex.envelope_hash == seed_000_hash(env) == tracedb.compute_envelope_hash(env)
    routed = dict(env, routingMetadata={"anything": 1})
    assert compute_envelope_hash(routed) == ex.envelope_hash
    ex.finish({"status": "success"})
    # The stored envelope re-hashes to the recorded hash (datetime kept as seed 000's str()).
    assert store.verify(ex.execution_id).ok


def test_reads_see_events_before_any_background_compaction(open_store):
    store = open_store()  # background compactor off
    ex = store.start("ProcessIntent", ENVELOPE)
    ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
    rec = store.get(ex.execution_id)
    assert rec.status == "running"
    assert [e.type for e in rec.events] == ["INTENT_RECEIVED"]
    assert rec.header.replayable is False


def test_each_call_is_durable_in_the_wal_when_it_returns(open_store):
    store = open_store()
    before = store.durable_lsn
    ex = store.start("X", {})
    assert store.durable_lsn == before + 1
    ex.event("tool.requested", {"tool": "search"})
    assert store.durable_lsn == before + 2
    ex.finish({"status": "success"})
    assert store.durable_lsn == before + 3


def test_seq_is_strictly_increasing_under_concurrent_callers(open_store):
    store = open_store()
    ex = store.start("X", {})
    others = [store.start("Y", {}) for _ in range(4)]
    seqs: list[int] = []
    lock = threading.Lock()

    def worker(target):
        for i in range(25):
            s = target.event("tool.requested", {"i": i})
            if target is ex:
                with lock:
                    seqs.append(s)

    threads = [threading.Thread(target=worker, args=(t,)) for t in [ex, ex, ex, *others]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seqs) == list(range(1, 76))
    events = store.get(ex.execution_id).events
    assert [e.seq for e in events] == list(range(1, 76))
    # Per execution, LSN order is seq order: the steps' LSNs increase with seq.
    import sqlalchemy as sa

    from tracedb.projection.models import trace_steps

    with store.engine.connect() as conn:
        lsns = conn.execute(
            sa.select(trace_steps.c.lsn).where(trace_steps.c.execution_id == ex.execution_id).order_by(trace_steps.c.seq)
        ).scalars().all()
    assert lsns == sorted(lsns)
    for o in others:
        assert [e.seq for e in store.get(o.execution_id).events] == list(range(1, 26))


@pytest.mark.parametrize(
    "close",
    [
        lambda s, ex: ex.finish({"status": "success"}),
        lambda s, ex: ex.invalidate("operator said so"),
        lambda s, ex: s.sweep_idle(s.clock() + 10**15),
    ],
    ids=["completed", "invalidated", "incomplete"],
)
def test_events_for_a_closed_execution_are_refused_and_change_nothing(open_store, close):
    store = open_store(idle_timeout_s=60)
    ex = store.start("X", {})
    ex.event("tool.requested", {"n": 1})
    close(store, ex)
    lsn = store.durable_lsn
    before = store.get(ex.execution_id).to_dict()
    with pytest.raises(tracedb.ExecutionClosedError) as err:
        ex.event("tool.responded", {"n": 2})
    assert err.value.hint
    with pytest.raises(tracedb.ExecutionClosedError):
        ex.finish({"status": "success"})
    assert store.durable_lsn == lsn
    assert store.get(ex.execution_id).to_dict() == before


def test_closed_execution_is_refused_after_reopen_too(open_store, data_dir):
    store = open_store()
    ex = record_seed_002(store)
    store.close()
    store = open_store()
    with pytest.raises(tracedb.ExecutionClosedError):
        store.event(ex.execution_id, "INTENT_RECEIVED", {})
    with pytest.raises(tracedb.ExecutionNotFoundError):
        store.event("exec-nope", "INTENT_RECEIVED", {})


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s, ex: ex.event("NOT_A_TYPE", {}), "unknown event type"),
        (lambda s, ex: ex.event(7, {}), "event type must be a string"),
        (lambda s, ex: ex.event("tool.requested", {"x": object()}), "not JSON-serialisable"),
        (lambda s, ex: ex.event("tool.requested", {"when": datetime.now()}), "not JSON-serialisable"),
        (lambda s, ex: ex.event("tool.requested", {1: "int key"}), "not JSON-serialisable"),
        (lambda s, ex: ex.finish(["not", "a", "dict"]), "must be a dict"),
        (lambda s, ex: s.start("X", ["not a dict"]), "envelope must be a dict"),
        (lambda s, ex: s.start("", {}), "intent"),
        (lambda s, ex: s.start("X", {}, "has space"), "execution_id"),
        (lambda s, ex: s.start("X", {}, forked_at_seq=3), "parent"),
        (lambda s, ex: s.invalidate(ex.execution_id, ""), "reason"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(open_store, call, message):
    store = open_store()
    ex = store.start("X", {})
    ex.event("tool.requested", {"ok": True})
    lsn = store.durable_lsn
    with pytest.raises(tracedb.InvalidInputError) as err:
        call(store, ex)
    assert message in str(err.value)
    assert store.durable_lsn == lsn
    # The execution is still usable and lost nothing.
    assert ex.event("tool.responded", {"ok": True}) == 2
    assert [e.seq for e in store.get(ex.execution_id).events] == [1, 2]


def test_seed_004_and_namespaced_types_are_accepted(open_store):
    store = open_store()
    ex = store.start("Chat", {"q": "hi"})
    types = ["llm.requested", "llm.responded", "tool.requested", "tool.responded", "myapp.cache.hit"]
    for t in types:
        ex.event(t, {"t": t})
    assert [e.type for e in store.get(ex.execution_id).events] == types


def test_final_response_event_is_finish(open_store):
    store = open_store()
    ex = store.start("X", {})
    assert ex.event("FINAL_RESPONSE", {"status": "success"}) == 1
    rec = store.get(ex.execution_id)
    assert rec.status == "completed" and rec.finalResponse == {"status": "success"}


def test_an_execution_id_is_never_started_twice(open_store):
    store = open_store()
    store.start("X", {}, "exec-1").finish({"status": "success"})
    with pytest.raises(tracedb.ExecutionExistsError):
        store.start("X", {}, "exec-1")  # known in memory
    store.close()
    store = open_store()
    with pytest.raises(tracedb.ExecutionExistsError):
        store.start("X", {}, "exec-1")  # known only to the database


def test_fork_lineage_is_recorded(open_store):
    store = open_store()
    parent = record_seed_002(store)
    fork = store.start("ProcessIntent", ENVELOPE, parent_execution_id=parent.execution_id, forked_at_seq=4)
    rec = store.get(fork.execution_id)
    assert rec.to_dict()["lineage"] == {"parentExecutionId": parent.execution_id, "forkedAtSeq": 4}
    with pytest.raises(tracedb.ExecutionNotFoundError):
        store.start("X", {}, parent_execution_id="exec-missing", forked_at_seq=1)


def test_the_four_replayability_states_of_seed_000(open_store):
    store = open_store(idle_timeout_s=60)
    done = record_seed_002(store, "exec-completed")
    cut = store.start("ProcessIntent", ENVELOPE, "exec-incomplete")
    cut.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
    store.sweep_idle(store.clock() + 61 * 10**9)
    failed = store.start("ProcessIntent", ENVELOPE, "exec-recording-failure")
    failed.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
    failed.mark_recording_failure("client dropped events")
    failed.finish({"status": "success"})
    gone = record_seed_002(store, "exec-invalidated")
    gone.invalidate("agent had a bug")

    def header(eid):
        r = store.get(eid)
        return r.status, r.header.replayable, r.header.replayableReason, r.finalResponse

    assert header(done.execution_id) == ("completed", True, None, {"status": "success"})
    assert header(cut.execution_id) == ("incomplete", False, "execution_incomplete", None)
    assert header(failed.execution_id) == ("completed", False, "recording_failure", {"status": "success"})
    assert header(gone.execution_id) == ("invalidated", False, "manually_invalidated", {"status": "success"})


def test_list_filters_by_status_and_time(open_store, clock):
    store = open_store()
    a = record_seed_002(store, "exec-a")
    clock.advance(3600)
    b = store.start("Other", {}, "exec-b")
    rows = store.list()
    assert [r.execution_id for r in rows] == ["exec-a", "exec-b"]
    assert [r.execution_id for r in store.list(status="running")] == [b.execution_id]
    cut = datetime.fromtimestamp(clock.ns / 1e9 - 10, tz=timezone.utc)
    assert [r.execution_id for r in store.list(since=cut)] == ["exec-b"]
    assert [r.execution_id for r in store.list(until=cut)] == [a.execution_id]
    assert len(store.list(limit=1)) == 1
    with pytest.raises(tracedb.InvalidInputError):
        store.list(status="bogus")


def test_sync_recording_inside_an_event_loop_says_what_to_call(open_store):
    store = open_store()
    ex = store.start("X", {})

    async def inside():
        with pytest.raises(tracedb.UsageError) as err:
            ex.event("tool.requested", {})
        assert "open_async" in err.value.hint

    asyncio.run(inside())


@pytest.mark.parametrize("aio", [True, False], ids=["loop-flushes", "thread-flushes"])
def test_asyncio_twin_records_the_same_way(data_dir, clock, aio):
    async def scenario():
        cfg = {"compact_interval_ms": 0, "wal_aio": aio}
        astore = await tracedb.open_async(data_dir, config=cfg, clock=clock)
        w = astore.store._wal
        # [wal] aio: the event loop flushes the WAL itself (Linux native AIO), else the thread.
        assert w.loop_attached == (aio and sys.platform.startswith("linux"))
        try:
            ex = await astore.start("ProcessIntent", ENVELOPE, "exec-a1b2c3d4")
            assert ex.envelope_hash == seed_000_hash(ENVELOPE)
            for seq, t, p in SEED_002_EVENTS[:-1]:
                assert await ex.event(t, p) == seq
            assert await ex.finish({"status": "success"}) == 8
            with pytest.raises(tracedb.ExecutionClosedError):
                await ex.event("INTENT_RECEIVED", {})
            # Concurrent events of many executions share group commits; seqs stay per execution.
            many = [await astore.start("X", {}) for _ in range(5)]
            await asyncio.gather(*(m.event("tool.requested", {"i": i}) for m in many for i in range(10)))
            for m in many:
                assert [e.seq for e in (await m.get()).events] == list(range(1, 11))
            await astore.invalidate(many[0].execution_id, "test")
            rec = await astore.get("exec-a1b2c3d4")
            assert [(e.seq, e.type, e.payload) for e in rec.events] == SEED_002_EVENTS
            assert (await astore.get(many[0].execution_id)).status == "invalidated"
            with pytest.raises(tracedb.ExecutionNotFoundError):
                await astore.event("exec-nope", "tool.requested", {})
        finally:
            await astore.close()
        assert not w.loop_attached

    asyncio.run(scenario())


def test_a_cancelled_async_start_or_finish_keeps_the_durable_record_tracked(data_dir, clock):
    # asyncio.wait_for and friends cancel the caller; the record was already queued in the WAL
    # and becomes durable regardless, so the store must keep tracking the execution: its id
    # is never accepted twice, and a clean close marks it incomplete instead of leaving it running.
    async def cancel_once_queued(astore, coro):
        w = astore.store._wal
        before = w.stats().appends
        task = asyncio.ensure_future(coro)
        # Cancelled as soon as its record is queued, before it is durable: look at every pass.
        await wait_until_async(lambda: w.stats().appends > before, 10, "the record to be queued", interval_s=0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def scenario():
        astore = await tracedb.open_async(data_dir, config={"compact_interval_ms": 0}, clock=clock)
        try:
            await cancel_once_queued(astore, astore.start("I", {"v": 1}, "exec-cancelled"))
            with pytest.raises(tracedb.ExecutionExistsError):
                await astore.start("I", {"v": 2}, "exec-cancelled")
            assert await astore.event("exec-cancelled", "tool.requested", {"n": 1}) == 1
            done = await astore.start("I", {"v": 3}, "exec-finished")
            await cancel_once_queued(astore, done.finish({"status": "success"}))
            # A later record is durable only after every earlier one: then the finish is too.
            await astore.start("I", {}, "exec-later")
            assert (await astore.get("exec-finished")).status == "completed"
        finally:
            await astore.close()

    asyncio.run(scenario())
    with tracedb.open(data_dir, clock=clock) as store:
        rec = store.get("exec-cancelled")
        assert rec.envelope == {"v": 1} and rec.status == "incomplete"
        assert [e.seq for e in rec.events] == [1]
        assert store.get("exec-finished").finalResponse == {"status": "success"}


def test_disabled_tracing_records_nothing(data_dir, clock):
    with tracedb.open(data_dir, config={"enabled": False, "compact_interval_ms": 0}, clock=clock) as store:
        ex = store.start("X", {})
        assert ex.event("tool.requested", {}) == 1
        assert ex.finish({"status": "success"}) == 2
        assert store.durable_lsn == 0
        assert store.list() == []


def test_store_is_a_context_manager_and_refuses_calls_after_close(data_dir, clock):
    with tracedb.open(data_dir, config={"compact_interval_ms": 0}, clock=clock) as store:
        ex = store.start("X", {})
    with pytest.raises(tracedb.StoreClosedError):
        ex.event("tool.requested", {})
    with tracedb.open(data_dir, config={"compact_interval_ms": 0}, clock=clock) as store:
        # Closing a store marks what it was still recording incomplete.
        assert store.get(ex.execution_id).status == "incomplete"


def test_second_opener_gets_store_in_use(open_store, data_dir):
    open_store()
    with pytest.raises(tracedb.StoreInUseError) as err:
        tracedb.open(data_dir)
    assert err.value.exit_code == 5
    assert "pid=" in err.value.message


def test_staged_batches_number_validate_and_append_together(data_dir, clock):
    from tracedb.recorder.state import StagedBatch

    async def scenario():
        astore = await tracedb.open_async(data_dir, config={"compact_interval_ms": 0}, clock=clock)
        store = astore.store
        loop = asyncio.get_running_loop()
        try:
            batch = StagedBatch()
            start = store.staging.reserve_start("ProcessIntent", ENVELOPE, "exec-a1b2c3d4")
            store.staging.check_new_in_db(start)
            store.staging.stage_start(batch, start)
            assert store.staging.next_seq("exec-a1b2c3d4") == 1
            for seq, t, p in SEED_002_EVENTS:
                assert store.staging.stage_event(batch, "exec-a1b2c3d4", t, p) == seq
            with pytest.raises(tracedb.ExecutionClosedError):
                store.staging.stage_event(batch, "exec-a1b2c3d4", "INTENT_RECEIVED", {})
            with pytest.raises(tracedb.InvalidInputError):
                store.staging.stage_event(batch, "exec-a1b2c3d4", "BOGUS", {})
            assert len(batch.payloads) == 9
            lsn_before = store.durable_lsn
            lsns = await store.staging.append_staged(batch, loop)
            assert lsns == list(range(lsn_before + 1, lsn_before + 10))
            rec = await astore.get("exec-a1b2c3d4")
            assert [(e.seq, e.type, e.payload) for e in rec.events] == SEED_002_EVENTS
            assert rec.status == "completed" and store.staging.next_seq("exec-a1b2c3d4") is None
            assert store.staging.status_of("exec-a1b2c3d4") == "completed"
            # Compacted and forgotten in memory: the database half of the check refuses it.
            again = store.staging.reserve_start("X", {}, "exec-a1b2c3d4")
            with pytest.raises(tracedb.ExecutionExistsError):
                store.staging.check_new_in_db(again)
            store.staging.cancel_start(again)
            other = store.staging.reserve_start("X", {})
            store.staging.cancel_start(other)
            assert store.staging.next_seq(other.execution_id) is None
            b2 = StagedBatch()
            assert store.staging.stage_invalidate(b2, "exec-unknown", "why") is False
            await astore.compact()
        finally:
            await astore.close()

    asyncio.run(scenario())


def test_an_orjson_fragment_that_is_not_json_is_refused_and_changes_nothing(open_store):
    import orjson

    store = open_store()
    ex = store.start("X", {"a": 1})
    before = store.durable_lsn
    for bad in (orjson.Fragment(b"{bad"), {"nested": [orjson.Fragment(b"[1,")]}):
        with pytest.raises(tracedb.InvalidInputError, match="valid JSON"):
            ex.event("tool.requested", bad)
    with pytest.raises(tracedb.InvalidInputError, match="valid JSON"):
        ex.finish({"status": "success", "payload": orjson.Fragment(b"nope")})
    with pytest.raises(tracedb.InvalidInputError, match="valid JSON"):
        store.start("X", {"envelope": orjson.Fragment(b"{")})
    assert store.durable_lsn == before
    # A Fragment holding JSON goes in as it is; the record stays readable.
    assert ex.event("tool.requested", orjson.Fragment(b'{"pre":"serialised"}')) == 1
    assert ex.finish({"status": "success"}) == 2
    store.compact()
    assert store.get(ex.execution_id).events[0].payload == {"pre": "serialised"}


def test_payloads_that_are_bare_json_numbers_read_back_once_compacted(open_store):
    # A JSON column of SQLite has NUMERIC affinity: `5` is stored as the integer 5, not as text.
    store = open_store()
    ex = store.start("ProcessIntent", ENVELOPE)
    values = [5, 0, -3, 1.5, 2**63 - 1, True, None, "7", [1.25]]
    for v in values:
        ex.event("tool.responded", v)
    ex.finish({"status": "success", "payload": 42})
    store.compact()
    rec = store.get(ex.execution_id)
    assert [e.payload for e in rec.events[:-1]] == values
    assert rec.finalResponse == {"status": "success", "payload": 42}


def test_a_bare_integer_payload_outside_64_bits_is_refused_embedded(open_store):
    store = open_store()
    ex = store.start("ProcessIntent", ENVELOPE)
    with pytest.raises(tracedb.InvalidInputError, match="64-bit"):
        ex.event("tool.responded", 2**63)
    assert ex.event("tool.responded", {"n": 2**63}) == 1


def test_a_creation_time_out_of_range_is_named_not_blamed_on_the_envelope(open_store):
    store = open_store()
    for bad in (2**70, 2**63, 0, -1, True, 1.5):
        with pytest.raises(tracedb.InvalidInputError, match="created_at_ns"):
            store.start("Import", {"intent": "Import"}, created_at_ns=bad)
    assert store.start("Import", {"intent": "Import"}, created_at_ns=2**63 - 1).execution_id


def test_event_types_are_matched_as_whole_strings_every_time(open_store):
    # A namespaced type is matched once and then found in a cache: near misses stay refused.
    store = open_store()
    ex = store.start("X", {"a": 1})
    assert ex.event("myapp.step", {}) == 1
    for bad in ("myapp.step\n", "myapp.step ", "myapp", "", 5, None, ["myapp.step"]):
        with pytest.raises(tracedb.InvalidInputError, match="event type"):
            ex.event(bad, {})
    assert ex.event("myapp.step", {}) == 2


def test_final_response_through_event_closes_the_execution_on_the_asyncio_api(tmp_path):
    async def run():
        astore = await tracedb.open_async(str(tmp_path / "d"), config={"compact_interval_ms": 0})
        try:
            ex = await astore.start("X", {"a": 1})
            assert await ex.event("tool.requested", {"q": 1}) == 1
            assert await ex.event("FINAL_RESPONSE", {"status": "success"}) == 2
            with pytest.raises(tracedb.ExecutionClosedError):
                await ex.event("tool.requested", {"q": 2})
            other = await astore.start("X", {"a": 2})
            assert await other.event("tool.requested", {"q": 3}) == 1  # the loop's sink, reused
            return (await ex.get()).status
        finally:
            await astore.close()

    assert asyncio.run(run()) == "completed"


def test_a_start_cannot_fork_past_its_parents_events(tmp_path):
    with tracedb.open(str(tmp_path / "d"), config={"compact_interval_ms": 0}) as store:
        parent = store.start("P", {"intent": "P"})
        parent.event("t.x", {})
        parent.event("t.x", {})
        with pytest.raises(tracedb.InvalidInputError, match="cannot fork"):  # running, held in memory
            store.start("P", {"intent": "P"}, parent_execution_id=parent.execution_id, forked_at_seq=3)
        parent.finish({"status": "success"})
        store.compact()
        for at in (4, 9):  # past the final response (seq 3)
            with pytest.raises(tracedb.InvalidInputError, match="cannot fork"):
                store.start("P", {"intent": "P"}, parent_execution_id=parent.execution_id, forked_at_seq=at)
        child = store.start("P", {"intent": "P"}, parent_execution_id=parent.execution_id, forked_at_seq=2)
        assert child.execution_id != parent.execution_id
