"""Exact replay (seed 000): the contract, the four replayability states, forced replay, envelope
verification, record integrity and the edge cases, on records built by hand."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import FakeClock
from tracedb.errors import (
    EXIT_INTEGRITY,
    EXIT_NOT_REPLAYABLE,
    IntegrityError,
    NotReplayableError,
    RecordCorruptedError,
    ReplayHashMismatchError,
)
from tracedb.records.record import ExecutionEvent, compute_envelope_hash
from tracedb.replay import exact
from tracedb.replay.exact import (
    FORCED_REPLAY_WARNING,
    ReplayCache,
    ReplayEngine,
    ReplayResult,
    verify_envelope,
    verify_event_sequence,
    verify_record_integrity,
)

SUCCESS = {"status": "success", "payload": {"capital": "Paris"}, "metadata": {"agent": "geo", "tokens": 12}}


# -- the contract and state 1 ------------------------------------------------------------------


def test_replayable_record_replays_its_final_response_exactly(record_factory):
    record = record_factory(final=SUCCESS)
    engine = ReplayEngine(record)
    assert engine.is_replayable() == (True, None)
    result = engine.replay()
    assert result.payload == {"capital": "Paris"}
    assert result.metadata == {"agent": "geo", "tokens": 12}
    assert result.response is record.finalResponse
    assert result.fromReplay is True
    assert result.originalExecutionId == "exec-1"
    assert result.originalTimestamp == "2026-01-02T03:04:05Z"
    assert result.warnings == []
    assert result.status == "success" and not result.is_error


def test_replay_result_has_the_seeds_fields_in_order():
    names = [f.name for f in dataclasses.fields(ReplayResult)]
    assert names[:6] == [
        "payload",
        "metadata",
        "fromReplay",
        "originalExecutionId",
        "originalTimestamp",
        "warnings",
    ]
    r = ReplayResult(payload=None, metadata={})
    assert r.fromReplay is True and r.warnings == []


def test_missing_metadata_replays_as_empty_dict(record_factory):
    result = ReplayEngine(record_factory(final={"status": "success", "payload": 1})).replay()
    assert result.metadata == {} and result.payload == 1


# -- states 2, 3, 4 and record_corrupted -------------------------------------------------------


def _refused(engine, reason: str, error: type = NotReplayableError):
    """The engine says the record is not replayable for `reason`, and replay() refuses it with
    `error` of that reason; the error."""
    assert engine.is_replayable() == (False, reason)
    with pytest.raises(error) as info:
        engine.replay()
    assert info.value.reason == reason
    return info.value


def test_state_2_execution_incomplete_raises_unless_forced(record_factory):
    record = record_factory(final=None, replayable=False, reason="execution_incomplete")
    engine = ReplayEngine(record)
    err = _refused(engine, "execution_incomplete")
    assert err.exit_code == EXIT_NOT_REPLAYABLE
    assert err.hint
    forced = engine.replay(force=True)
    assert forced.payload is None  # "may return null payload"
    assert forced.metadata == {}
    assert forced.response is None
    assert forced.warnings == [FORCED_REPLAY_WARNING]


def test_running_execution_without_final_response_is_incomplete(record_factory):
    # A header still marked replayable but without a final response: the seed's first check.
    engine = ReplayEngine(record_factory(final=None, replayable=True))
    assert engine.is_replayable() == (False, "execution_incomplete")


def test_state_3_recording_failure_raises_though_a_final_response_exists(record_factory):
    record = record_factory(final=SUCCESS, replayable=False, reason="recording_failure")
    engine = ReplayEngine(record)
    _refused(engine, "recording_failure")
    forced = engine.replay(force=True)
    assert forced.payload == {"capital": "Paris"}
    assert forced.warnings == ["Forced replay of non-replayable record"]


def test_state_4_manually_invalidated_raises(record_factory):
    # As the seed shows it: the header alone, no final response.
    record = record_factory(final=None, replayable=False, reason="manually_invalidated")
    _refused(ReplayEngine(record), "manually_invalidated")


def test_invalidated_completed_record_raises_too(record_factory):
    engine = ReplayEngine(record_factory(final=SUCCESS, replayable=False, reason="manually_invalidated"))
    with pytest.raises(NotReplayableError) as info:
        engine.replay()
    assert info.value.reason == "manually_invalidated"
    assert engine.replay(force=True).warnings == [FORCED_REPLAY_WARNING]


def test_tampered_envelope_makes_the_record_corrupted(record_factory):
    record = record_factory(final=SUCCESS)
    record.envelope["payload"] = {"country": "Spain"}  # changed after the hash was recorded
    engine = ReplayEngine(record)
    err = _refused(engine, "record_corrupted", RecordCorruptedError)
    assert isinstance(err, NotReplayableError) and isinstance(err, IntegrityError)
    assert err.exit_code == EXIT_INTEGRITY
    assert "envelope hash" in str(err)
    assert engine.replay(force=True).warnings == [FORCED_REPLAY_WARNING]


@pytest.mark.parametrize("seqs", [[1, 1], [2, 1], [1, 3, 2], [0, 1]])
def test_events_out_of_order_make_the_record_corrupted(record_factory, seqs):
    events = [ExecutionEvent(s, "AGENT_ATTEMPT_START", {}) for s in seqs]
    engine = ReplayEngine(record_factory(final=SUCCESS, events=events))
    assert engine.is_replayable() == (False, "record_corrupted")
    with pytest.raises(RecordCorruptedError, match="strictly increasing"):
        engine.replay()


def test_forced_replay_of_unparseable_final_response_raises_integrity_error(record_factory):
    record = record_factory(final=SUCCESS)
    record.finalResponse = "not an object"
    with pytest.raises(RecordCorruptedError):
        ReplayEngine(record).replay(force=True)


def test_bare_hex_envelope_hash_is_accepted(record_factory):
    record = record_factory(final=SUCCESS)
    record.header.envelopeHash = record.header.envelopeHash[len("sha256:"):]
    assert ReplayEngine(record).is_replayable() == (True, None)


# -- envelope verification ---------------------------------------------------------------------


def test_same_envelope_verifies(record_factory):
    record = record_factory(final=SUCCESS)
    assert ReplayEngine(record).replay(env=dict(record.envelope)).payload == {"capital": "Paris"}


def test_routing_metadata_is_not_part_of_the_hash(record_factory):
    record = record_factory(final=SUCCESS)
    env = dict(record.envelope, routingMetadata={"host": "worker-9", "attempt": 3})
    assert ReplayEngine(record).replay(env=env).payload == {"capital": "Paris"}


def test_modified_envelope_raises_hash_mismatch_with_both_hashes(record_factory):
    record = record_factory(final=SUCCESS)
    env = dict(record.envelope, payload={"country": "Italy"})
    with pytest.raises(ReplayHashMismatchError) as info:
        ReplayEngine(record).replay(env=env)
    err = info.value
    assert err.recorded == record.header.envelopeHash
    assert err.provided == compute_envelope_hash(env)
    assert err.recorded != err.provided
    assert err.exit_code == EXIT_INTEGRITY
    assert "Envelope modified since original execution" in str(err)


def test_envelope_object_with_to_dict_is_verified(record_factory):
    record = record_factory(final=SUCCESS)

    class IntentEnvelope:
        def __init__(self, data):
            self.data = data

        def to_dict(self):
            return self.data

    assert ReplayEngine(record).replay(env=IntentEnvelope(dict(record.envelope))).fromReplay
    with pytest.raises(ReplayHashMismatchError):
        ReplayEngine(record).replay(env=IntentEnvelope({"intent": "other"}))


def test_envelope_is_verified_on_forced_replay_too(record_factory):
    record = record_factory(final=None, replayable=False, reason="execution_incomplete")
    with pytest.raises(ReplayHashMismatchError):
        ReplayEngine(record).replay(env={"intent": "other"}, force=True)


def test_verify_envelope_result():
    assert verify_envelope("sha256:aa", "sha256:aa").match
    r = verify_envelope("sha256:aa", "sha256:bb")
    assert (r.match, r.recorded_hash, r.provided_hash) == (False, "sha256:aa", "sha256:bb")
    assert r.error == "Envelope modified since original execution"


# -- integrity helpers ---------------------------------------------------------------------------


def test_verify_record_integrity(record_factory):
    record = record_factory(final=SUCCESS)
    assert verify_record_integrity(record)
    record.envelope["intent"] = "changed"
    assert not verify_record_integrity(record)


def test_verify_event_sequence(record_factory):
    ok = record_factory(final=SUCCESS, events=[ExecutionEvent(s, "X", None) for s in (1, 2, 5)])
    bad = record_factory(final=SUCCESS, events=[ExecutionEvent(s, "X", None) for s in (1, 2, 2)])
    assert verify_event_sequence(ok)
    assert not verify_event_sequence(bad)


# -- edge cases ------------------------------------------------------------------------------------


def test_empty_payload_replays_as_none(record_factory):
    result = ReplayEngine(record_factory(final={"status": "success", "payload": None})).replay()
    assert result.payload is None
    assert result.status == "success"
    assert result.warnings == []


def test_error_response_replays_as_that_error_not_success(record_factory):
    final = {"status": "error", "error": {"code": "AGENT_ERROR", "message": "Failed"}}
    result = ReplayEngine(record_factory(final=final)).replay()
    assert result.is_error
    assert result.status == "error"
    assert result.error == {"code": "AGENT_ERROR", "message": "Failed"}
    assert result.payload is None
    assert result.response == final


def test_large_payload_replays_in_full(record_factory):
    data = "..." * 1000000  # 3 MB, as in the seed
    result = ReplayEngine(record_factory(final={"payload": {"data": data}})).replay()
    assert len(result.payload["data"]) == 3_000_000
    assert result.payload["data"] == data


# -- the hot path ------------------------------------------------------------------------------------


def test_structure_is_validated_once_per_engine(record_factory, monkeypatch):
    calls = []
    real = exact.record_problems
    monkeypatch.setattr(exact, "record_problems", lambda r: calls.append(1) or real(r))
    engine = ReplayEngine(record_factory(final=SUCCESS))
    for _ in range(5):
        engine.replay()
    assert len(calls) == 1


# -- the cache ------------------------------------------------------------------------------------------


def test_cache_expires_entries_after_their_ttl():
    clock = FakeClock(1000.0, per_second=1)
    cache = ReplayCache(default_ttl_s=10, clock=clock)
    cache.set("a", 1)
    cache.set("b", 2, ttl=100)
    clock.now += 9.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None
    assert cache.get("b") == 2


def test_cache_evicts_least_recently_used():
    cache = ReplayCache(max_entries=2)
    cache.set("a", 1)
    cache.set("b", 2)
    cache.get("a")
    cache.set("c", 3)
    assert cache.get("b") is None
    assert (cache.get("a"), cache.get("c"), len(cache)) == (1, 3, 2)
    cache.invalidate("a")
    assert cache.get("a") is None
