"""tracedb's WAL records: their kinds, and how each is written and read back.

An event, the bulk of a log, is framed so that its payload goes into `trace_steps` as the JSON text
the recorder serialised, never decoded and encoded again by the compactor:

    0x01, JSON array [id, seq, type, t, facts], "\\n", payload JSON

`facts` is what the payload adds to its execution's derived columns (`outcomes.event_facts`,
worked out by the store from the payload as stored, after redaction): [] for nothing, else
[error or null, usage or null], error {"code", "message"}, usage [model or null, input tokens,
output tokens, cached input tokens]. Compaction and the read of the WAL take them from the
frame instead of decoding the payload. A record written before facts were framed has four
items; its payload is decoded when it may matter, as before.

Every other record is one orjson document:

    {"op": "start", "id", "intent", "envelope", "hash", "t", ["parent", "fork_seq"], ["meta"]}
    {"op": "finish", "id", "seq", "response", "t"}            -> a FINAL_RESPONSE step
    {"op": "invalidate", "id", "reason", "t"}
    {"op": "incomplete", "id", "why", "t"}
    {"op": "recording_failure", "id", "detail", "t"}

The store writes them (`tracedb.recorder.store`), the compactor and recovery read them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import orjson

from tracedb.records.record import (
    REASON_EXECUTION_INCOMPLETE,
    REASON_MANUALLY_INVALIDATED,
    REASON_RECORDING_FAILURE,
    STATUS_COMPLETED,
    STATUS_INCOMPLETE,
    STATUS_INVALIDATED,
    STATUS_RUNNING,
    keeps_reason,
)
from tracedb.records.validation import ENVELOPE_OPTS, dumps, dumps_checked

OP_START = "start"
OP_EVENT = "event"  # what `decode_record` calls a framed event
OP_FINISH = "finish"
OP_INVALIDATE = "invalidate"
OP_INCOMPLETE = "incomplete"
OP_RECORDING_FAILURE = "recording_failure"
# The key holding each status change's text.
STATUS_TEXT_KEY = {OP_INVALIDATE: "reason", OP_INCOMPLETE: "why", OP_RECORDING_FAILURE: "detail"}

EVENT_TAG = 0x01  # never the first byte of a JSON document


def encode_event(execution_id: str, seq: int, type_: str, payload_json: bytes, t: int,
                 facts: Optional[tuple] = None) -> bytes:
    """One event's record; `payload_json` is the payload already serialised, `facts` its
    `outcomes.event_facts` (None: a frame without them, as records were written before)."""
    # JSON escapes newlines inside strings, so the first b"\n" ends the header.
    head = (execution_id, seq, type_, t) if facts is None else (execution_id, seq, type_, t, facts)
    return b"\x01" + orjson.dumps(head) + b"\n" + payload_json


def event_payload_offset(record: bytes, payload_json: bytes) -> int:
    """Where the payload starts inside an event's record."""
    return len(record) - len(payload_json)


class EventFrame(NamedTuple):
    """An event record's frame: whose event it is, and where its payload JSON starts.

    `split_event` reads it from the record's bytes; the store builds it as it encodes the record
    and hands it to the WAL with the record (the compaction hint, kept in memory only), so that
    the compactor of the same process does not split the frame again nor decode the payload for
    the derived columns. A hint must say what the record says."""

    execution_id: str
    seq: int
    type: str
    payload_offset: int  # the payload JSON is record[payload_offset:]
    t: int
    # What the event adds to the derived columns (`outcomes.event_facts`), as its frame says (lists)
    # or the store handed it over; None: a record framed without them (the reader decodes the
    # payload if needed).
    facts: Optional[tuple] = None


def is_event(record: bytes) -> bool:
    """Whether a record is a framed event (every other record is a JSON document)."""
    return record[:1] == b"\x01"


def split_event(record: bytes, _new=tuple.__new__, _loads=orjson.loads) -> EventFrame:
    """The frame of an event's record (`encode_event`): the one place it is parsed."""
    cut = record.index(b"\n")
    head = _loads(record[1:cut])
    # The tuple made directly, not through the named tuple's Python __new__: once per event read.
    if len(head) == 5:
        eid, seq, type_, t, facts = head
        if type(facts) is not list:
            raise TypeError(f"an event record's facts are a JSON array, not {type(facts).__name__}")
        return _new(EventFrame, (eid, seq, type_, cut + 1, t, facts))
    eid, seq, type_, t = head
    return _new(EventFrame, (eid, seq, type_, cut + 1, t, None))


def encode_start(
    execution_id: str, intent: str, envelope: dict, envelope_hash: str, t: int,
    parent_execution_id: Optional[str] = None, forked_at_seq: Optional[int] = None,
    meta: Optional[dict] = None,
) -> bytes:
    """A start record; the envelope is serialised the way it was hashed. `meta` goes into the
    trace's `meta` column (the stored envelope's hash after redaction, an imported header)."""
    doc: dict[str, Any] = {
        "op": OP_START, "id": execution_id, "intent": intent, "envelope": envelope,
        "hash": envelope_hash, "t": t,
    }
    if parent_execution_id is not None:
        doc["parent"] = parent_execution_id
        doc["fork_seq"] = forked_at_seq
    if meta:
        doc["meta"] = meta
    return dumps_checked(doc, "envelope", ENVELOPE_OPTS, default=str)


def encode_finish(execution_id: str, seq: int, response: dict, t: int) -> bytes:
    """The final response's record (a FINAL_RESPONSE step once compacted)."""
    return dumps_checked(
        {"op": OP_FINISH, "id": execution_id, "seq": seq, "response": response, "t": t}, "final response"
    )


def encode_status(op: str, execution_id: str, text: str, t: int) -> bytes:
    """A status change: invalidate, incomplete or recording_failure, with its text."""
    key = STATUS_TEXT_KEY[op]
    return dumps({"op": op, "id": execution_id, key: text, "t": t}, key)


def decode_record(raw: bytes) -> dict:
    """One record as a document, events in the shape {"op": "event", "id", "seq", "type",
    "payload", "t"} (for tools and tests; the compactor itself never decodes event payloads)."""
    if is_event(raw):
        f = split_event(raw)
        return {"op": OP_EVENT, "id": f.execution_id, "seq": f.seq, "type": f.type,
                "payload": orjson.loads(raw[f.payload_offset :]), "t": f.t}
    return orjson.loads(raw)


# The reason each lifecycle record gives (a finish: replayable, no reason).
OP_REASON = {
    OP_FINISH: None,
    OP_INVALIDATE: REASON_MANUALLY_INVALIDATED,
    OP_INCOMPLETE: REASON_EXECUTION_INCOMPLETE,
    OP_RECORDING_FAILURE: REASON_RECORDING_FAILURE,
}


def transition(row: dict, op: str, d: dict) -> None:
    """Apply a lifecycle record to a row (a new trace's full row, or a delta for an existing one).

    The one rule of every status change (the sweeper's, a clean stop's and recovery's
    `incomplete`, a finish, a flag, an invalidation, and a rebuild from the WAL): nothing changes
    an invalidated row; `incomplete` closes only a running one; the reason (with its note, and
    replayable) is replaced only by one at least as strong (`record.keeps_reason`), so a
    `recording_failure` outlives every later `incomplete` and finish. A delta starts from what
    the database holds, assumed running and unflagged; the UPDATE statement applies the same
    rule to the row it finds (`compactor._update_statement`).
    """
    status = row.get("status")
    if status == STATUS_INVALIDATED:
        return
    if op == OP_INVALIDATE:
        row["status"] = STATUS_INVALIDATED
    elif op == OP_INCOMPLETE:
        if status not in (None, STATUS_RUNNING):
            return
        row["status"] = STATUS_INCOMPLETE
    elif op == OP_FINISH:
        row["status"] = STATUS_COMPLETED
    reason = OP_REASON[op]
    if keeps_reason(row.get("replayable_reason"), reason):
        return
    row["replayable"] = reason is None
    row["replayable_reason"] = reason
    if op != OP_FINISH:
        row["status_note"] = d.get(STATUS_TEXT_KEY[op])
