"""Exact replay by execution id from the real store: seed 000's four states as the store produces
them, the caching engine, batch replay, and integrity failures of a tampered database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import tracedb
from tracedb.errors import (
    ExecutionNotFoundError,
    NotReplayableError,
    RecordCorruptedError,
    ReplayHashMismatchError,
)
from tracedb.replay.exact import (
    FORCED_REPLAY_WARNING,
    CachingReplayEngine,
    ReplayCache,
    ReplayEngine,
    batch_replay,
    replay_execution,
)

ENVELOPE = {"intent": "lookup_capital", "payload": {"country": "France"}, "routingMetadata": {"host": "w1"}}
RESPONSE = {"status": "success", "payload": {"capital": "Paris"}, "metadata": {"agent": "geo"}}


def completed(store, response=RESPONSE, envelope=ENVELOPE):
    ex = store.start("lookup_capital", envelope)
    ex.event("INTENT_RECEIVED", {"intent": "lookup_capital"})
    ex.event("ROUTER_DECISION", {"agent": "geo"})
    ex.finish(response)
    return ex.execution_id


def test_replay_by_id_returns_the_recorded_response(store):
    exec_id = completed(store)
    result = replay_execution(store, exec_id)
    assert result.payload == {"capital": "Paris"}
    assert result.metadata == {"agent": "geo"}
    assert result.response == RESPONSE
    assert result.originalExecutionId == exec_id
    assert result.originalTimestamp == store.get(exec_id).header.createdUtcIso
    assert result.warnings == []


def test_replay_by_id_verifies_the_envelope(store):
    exec_id = completed(store)
    assert replay_execution(store, exec_id, env=dict(ENVELOPE, routingMetadata={"host": "w2"})).fromReplay
    with pytest.raises(ReplayHashMismatchError):
        replay_execution(store, exec_id, env=dict(ENVELOPE, payload={"country": "Peru"}))


def test_unknown_id_is_not_found(store):
    with pytest.raises(ExecutionNotFoundError):
        replay_execution(store, "exec-nope")


def test_execution_left_running_at_close_replays_as_incomplete(tmp_path):
    data = str(tmp_path / "d")
    with tracedb.open(data) as s:
        ex = s.start("lookup_capital", ENVELOPE)
        ex.event("INTENT_RECEIVED", {"intent": "lookup_capital"})
        exec_id = ex.execution_id
    with tracedb.open(data) as s:
        with pytest.raises(NotReplayableError) as info:
            replay_execution(s, exec_id)
        assert info.value.reason == "execution_incomplete"
        forced = replay_execution(s, exec_id, force=True)
        assert forced.payload is None and forced.warnings == [FORCED_REPLAY_WARNING]


def test_invalidated_execution_is_not_replayable(store):
    exec_id = completed(store)
    store.invalidate(exec_id, "wrong model version")
    with pytest.raises(NotReplayableError) as info:
        replay_execution(store, exec_id)
    assert info.value.reason == "manually_invalidated"
    assert replay_execution(store, exec_id, force=True).payload == {"capital": "Paris"}


def test_recording_failure_is_not_replayable(store):
    ex = store.start("lookup_capital", ENVELOPE)
    ex.mark_recording_failure("payload truncated by the agent SDK")
    ex.finish(RESPONSE)
    with pytest.raises(NotReplayableError) as info:
        replay_execution(store, ex.execution_id)
    assert info.value.reason == "recording_failure"


def test_tampered_envelope_in_the_database_is_an_integrity_failure(store):
    exec_id = completed(store)
    store.compact()
    traces = sa.table("traces", sa.column("execution_id"), sa.column("envelope", sa.JSON))
    with store.engine.begin() as conn:
        conn.execute(
            traces.update().where(traces.c.execution_id == exec_id).values(envelope={"intent": "tampered"})
        )
    with pytest.raises(RecordCorruptedError) as info:
        replay_execution(store, exec_id)
    assert info.value.exit_code == 4


def test_none_payload_error_response_and_large_payload_round_trip_the_store(store):
    none_id = completed(store, {"status": "success", "payload": None})
    err = {"status": "error", "error": {"code": "AGENT_ERROR", "message": "Failed"}}
    err_id = completed(store, err)
    big = "..." * 1000000
    big_id = completed(store, {"payload": {"data": big}})
    assert replay_execution(store, none_id).payload is None
    r = replay_execution(store, err_id)
    assert r.is_error and r.error == err["error"] and r.payload is None
    assert replay_execution(store, big_id).payload["data"] == big


def test_caching_engine_loads_once_and_serves_from_cache(store):
    exec_id = completed(store)
    engine = CachingReplayEngine(store)
    first = engine.replay(exec_id)
    second = engine.replay(exec_id)
    assert second is first
    assert (engine.misses, engine.hits) == (1, 1)
    engine.invalidate(exec_id)
    assert engine.replay(exec_id) == first and engine.misses == 2


def test_caching_engine_does_not_cache_failures(store):
    exec_id = completed(store)
    store.invalidate(exec_id, "bad")
    engine = CachingReplayEngine(store, ReplayCache(max_entries=8))
    for _ in range(2):
        with pytest.raises(NotReplayableError):
            engine.replay(exec_id)
    assert engine.misses == 2


def test_caching_engine_accepts_the_seeds_load_store(store):
    exec_id = completed(store)

    class ExecutionStore:  # the seed's interface: load(execution_id)
        def load(self, execution_id):
            return store.get(execution_id)

    assert CachingReplayEngine(ExecutionStore()).replay(exec_id).payload == {"capital": "Paris"}


def test_batch_replay_reports_non_replayable_records_instead_of_failing(store):
    ok = completed(store)
    bad = completed(store)
    store.invalidate(bad, "operator")
    results = batch_replay(store, [ok, bad])
    assert list(results) == [ok, bad]
    assert results[ok].payload == {"capital": "Paris"} and results[ok].warnings == []
    r = results[bad]
    assert r.payload is None and r.fromReplay and r.originalExecutionId == bad
    assert r.warnings == ["Not replayable: manually_invalidated"]
    assert r.metadata["error"] == "manually_invalidated"


def test_engine_on_a_stored_record_validates_once(store):
    engine = ReplayEngine(store.get(completed(store)))
    assert engine.is_replayable() == (True, None)
    assert engine.problems == []
