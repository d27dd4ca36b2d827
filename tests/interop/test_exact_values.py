"""Exact or refused, on SQLite: NaN, infinities, big integers, any unicode, nesting; every value
tracedb accepts comes back identical through record, compaction, get, export and import, and
every value it refuses leaves the WAL as it was."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

import tracedb

from .exact_roundtrip import round_trip, values

# Exactness is tested without the default redaction: a generated key such as "APIKEY" would be
# rewritten (tests/store and tests/sidecar test redaction).
SETTINGS = {"compact_interval_ms": 0, "idle_timeout_s": 0, "redact": False}


@pytest.fixture
def stores(tmp_path):
    a = tracedb.open(str(tmp_path / "a"), config=SETTINGS)
    b = tracedb.open(str(tmp_path / "b"), config=SETTINGS)
    yield a, b
    a.close()
    b.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(v_env=values, v_event=values, v_bare=values, v_response=values)
def test_values_come_back_identical_or_are_refused_before_anything_is_written(stores, v_env, v_event, v_bare, v_response):
    round_trip(*stores, v_env, v_event, v_bare, v_response)


@pytest.mark.parametrize(
    "v_env, v_event, v_bare, v_response",
    [
        # The values that were changed silently: NaN and infinities (stored as null), bare
        # whole floats (given back as integers), and the ones that must pass untouched.
        (1, {"score": math.nan}, "x", 1),
        (1, 1, math.inf, 1),
        ({"x": -math.inf}, 1, "x", 1),
        (1, 1, 1.0, 1),
        (1, 1, -0.0, 1),
        (1, 1, 1e16, 1),
        (1, 1, 3.611192091442987e-308, 1),  # SQLite reads it back one unit in the last place away
        (1, 1, "x", {"n": 1 << 64}),
        (1, 1, "x", {"n": "\ud800"}),
        ({"big": (1 << 64) - 1, "neg": -(1 << 63), "f": -0.0, "one": 1.0}, [1e16, 1e-300, 0.1], 1.5,
         {"s": "\u0000 \u2028 \U0001F600 é", "n": None, "t": True}),
    ],
)
def test_the_values_that_used_to_change_silently(stores, v_env, v_event, v_bare, v_response):
    round_trip(*stores, v_env, v_event, v_bare, v_response)


def test_nan_through_the_recording_api_is_refused_naming_where_it_is(tmp_path):
    with tracedb.open(str(tmp_path / "d"), config=SETTINGS) as store:
        ex = store.start("Score", {"intent": "Score"})
        lsn = store.durable_lsn
        with pytest.raises(tracedb.InvalidInputError) as err:
            ex.event("agent.answer", {"answer": {"score": math.nan}})
        assert "NaN or infinity" in err.value.message and "$.answer.score" in err.value.message
        with pytest.raises(tracedb.InvalidInputError):
            ex.finish({"status": "success", "payload": {"score": math.inf}})
        with pytest.raises(tracedb.InvalidInputError):
            store.start("Score", {"intent": "Score", "threshold": math.nan})
        for bare in (1.0, -0.0, 1e16):  # SQLite would hand these back as the integers 1, 0, 10**16
            with pytest.raises(tracedb.InvalidInputError) as err:
                ex.event("agent.score", bare)
            assert "wrap it in an object" in err.value.hint
        assert store.durable_lsn == lsn  # nothing of any of them reached the WAL
        assert ex.event("agent.answer", {"answer": {"score": 0.5}}) == 1  # the execution goes on
        ex.finish({"status": "success", "payload": {"score": 0.5}})
        rec = store.get(ex.execution_id)
        assert rec.header.replayable and tracedb.ReplayEngine(rec).replay().payload == {"score": 0.5}


def test_a_bare_nan_is_refused_as_not_a_json_number_not_as_a_float_to_wrap(tmp_path):
    """JSON has no NaN or infinity, inside an object or not: the error says so, and its hint is
    the one that works (a string or null), not wrapping the value."""
    with tracedb.open(str(tmp_path / "d"), config=SETTINGS) as store:
        ex = store.start("Score", {"intent": "Score"})
        for bare in (math.nan, math.inf, -math.inf):
            with pytest.raises(tracedb.InvalidInputError) as err:
                ex.event("agent.score", bare)
            assert "NaN or infinity" in err.value.message and "wrap" not in err.value.hint
            assert "null" in err.value.hint


class _Int(int):
    """An int subclass (an IntEnum's members are ints so)."""


def test_a_bare_number_given_as_json_text_or_an_int_subclass_is_checked_as_the_number_it_is(tmp_path):
    """An `orjson.Fragment` holding a bare number, or an int subclass, gets the rules of the
    bare number it stands for; text SQLite would not give back as written is refused, and
    nothing reaches the WAL."""
    with tracedb.open(str(tmp_path / "d"), config=SETTINGS) as store:
        ex = store.start("Score", {"intent": "Score"})
        lsn = store.durable_lsn
        for bare in (orjson.Fragment(b"3.611192091442987e-308"), orjson.Fragment(b"1.0"),
                     orjson.Fragment(b"1.50"), orjson.Fragment(b"18446744073709551616"), _Int(1 << 63)):
            with pytest.raises(tracedb.InvalidInputError) as err:
                ex.event("agent.score", bare)
            assert "wrap it in an object" in err.value.hint, bare
        assert store.durable_lsn == lsn
        assert ex.event("agent.score", orjson.Fragment(b"1.5")) == 1
        assert ex.event("agent.score", _Int(25)) == 2
        assert ex.event("agent.score", orjson.Fragment(b"-7")) == 3
        ex.finish({"status": "success"})
        store.compact()
        rec = store.get(ex.execution_id)
        assert [e.payload for e in rec.events[:3]] == [1.5, 25, -7]
        assert rec.header.replayable
        assert store.verify().problems == ()

def test_the_asyncio_twin_records_a_whole_execution_or_nothing(tmp_path):
    import asyncio

    async def run():
        astore = await tracedb.open_async(str(tmp_path / "d"), config=SETTINGS)
        lsn = astore.store.durable_lsn
        with pytest.raises(tracedb.InvalidInputError):
            await astore.record_execution(
                "I", {"intent": "I"}, "exec-b", events=[("myapp.x", {"a": 1}), ("myapp.x", {"a": math.nan})],
                response={"status": "ok"},
            )
        assert astore.store.durable_lsn == lsn
        ex = await astore.record_execution(
            "I", {"intent": "I"}, "exec-b", events=[("myapp.x", {"a": 1})], response={"status": "ok"},
        )
        assert isinstance(ex, tracedb.AsyncExecution) and ex.execution_id == "exec-b"
        rec = await ex.get()
        await astore.close()
        return rec

    rec = asyncio.run(run())
    assert (rec.status, [e.type for e in rec.events]) == ("completed", ["myapp.x", "FINAL_RESPONSE"])
