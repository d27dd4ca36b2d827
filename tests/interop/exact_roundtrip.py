"""Exact or refused: arbitrary JSON-like values through record, compaction, get, export and
import, for a SQLite and a PostgreSQL test alike.

Every value tracedb accepts must come back identical (types included: 1 is not 1.0, True is not
1, -0.0 is not 0.0); every value it refuses must be refused before anything is written, so that
the WAL does not move."""

from __future__ import annotations

import json
import math
import sqlite3
import uuid

import orjson
import pytest
from hypothesis import strategies as st

import tracedb
from tracedb.interop.intentusnet import to_intentusnet_dict, write_record

I64 = 1 << 63

# Strings of any code point, lone surrogates included (orjson cannot encode those).
text = st.text(alphabet=st.characters(codec=None, blacklist_categories=()), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)


def _refused(value, *, bare: bool = False) -> bool:
    """Whether tracedb's rule refuses `value`: NaN or infinity, an integer outside orjson's
    range, a lone surrogate anywhere; as a bare payload also an integer outside 64 signed bits or
    a float that is a whole number the database would give back as an integer."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        if bare:
            return not -I64 <= value < I64
        return not -I64 <= value < 1 << 64
    if isinstance(value, float):
        if not math.isfinite(value):
            return True
        if not bare:
            return False
        # A whole number SQLite would give back as an integer, or one its reading of the text
        # would change (its conversion is not correctly rounded for every float).
        text = orjson.dumps(value).decode()
        return (value.is_integer() and -I64 <= value < I64) or \
            sqlite3.connect(":memory:").execute("SELECT CAST(? AS REAL)", (text,)).fetchone()[0] != value
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return any(_refused(v) for v in value)
    return any(_refused(k) or _refused(v) for k, v in value.items())


def strict(value) -> bytes:
    """A value's exact JSON spelling: equal bytes only for the same types and the same numbers."""
    return orjson.dumps(value)


def execution_parts(v_env, v_event, v_bare, v_response):
    envelope = {"intent": "Prop", "payload": v_env}
    events = [("INTENT_RECEIVED", {"v": v_event}), ("myapp.step", v_bare)]
    response = {"status": "success", "payload": v_response}
    return envelope, events, response


def round_trip(source, target, v_env, v_event, v_bare, v_response) -> None:
    """Record into `source` (one whole record), compact, get; export in IntentusNet's form as
    `tracedb export` writes it, import that text into `target`, get and export again."""
    envelope, events, response = execution_parts(v_env, v_event, v_bare, v_response)
    eid = "prop-" + uuid.uuid4().hex
    refused = _refused(v_env) or _refused(v_event) or _refused(v_bare, bare=True) or _refused(v_response)
    lsn = source.durable_lsn
    if refused:
        with pytest.raises(tracedb.InvalidInputError):
            source.record_execution("Prop", envelope, eid, events=events, response=response)
        assert source.durable_lsn == lsn, "a refused record wrote to the WAL"
        with pytest.raises(tracedb.ExecutionNotFoundError):
            source.get(eid)
        return
    source.record_execution("Prop", envelope, eid, events=events, response=response)
    source.compact()
    rec = source.get(eid)
    assert strict(rec.envelope) == strict(envelope)
    assert [(e.type, strict(e.payload)) for e in rec.events] == [
        *((t, strict(p)) for t, p in events), ("FINAL_RESPONSE", strict(response)),
    ]
    assert strict(rec.finalResponse) == strict(response)
    assert rec.header.replayable is True
    assert tracedb.ReplayEngine(rec).replay().response == response

    # Export as the CLI writes a file (IntentusNet's json.dump form), import what it wrote.
    exported = json.dumps(to_intentusnet_dict(rec), ensure_ascii=False, indent=2)
    assert write_record(target, json.loads(exported)) == "imported"
    assert write_record(target, json.loads(exported)) == "present"
    target.compact()
    again = target.get(eid)
    assert [(e.type, strict(e.payload)) for e in again.events] == [(e.type, strict(e.payload)) for e in rec.events]
    assert json.dumps(to_intentusnet_dict(again), ensure_ascii=False, indent=2) == exported
