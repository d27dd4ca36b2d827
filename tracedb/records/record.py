"""The execution record in the shape of IntentusNet's ExecutionRecord (header, envelope, events, final response).

These are plain frozen-ish dataclasses, independent of the database: the store builds them from
rows, the replay engines consume them, `to_dict()` gives the wire/CLI JSON shape.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

import orjson

# Event types: an intent router's lifecycle, and LLM / tool calls.
INTENT_RECEIVED = "INTENT_RECEIVED"
AGENT_ATTEMPT_START = "AGENT_ATTEMPT_START"
AGENT_ATTEMPT_END = "AGENT_ATTEMPT_END"
FALLBACK_TRIGGERED = "FALLBACK_TRIGGERED"
ROUTER_DECISION = "ROUTER_DECISION"
FINAL_RESPONSE = "FINAL_RESPONSE"
LLM_REQUESTED = "llm.requested"
LLM_RESPONDED = "llm.responded"
TOOL_REQUESTED = "tool.requested"
TOOL_RESPONDED = "tool.responded"

ROUTER_EVENT_TYPES = frozenset(
    {
        INTENT_RECEIVED,
        AGENT_ATTEMPT_START,
        AGENT_ATTEMPT_END,
        FALLBACK_TRIGGERED,
        ROUTER_DECISION,
        FINAL_RESPONSE,
    }
)
CALL_EVENT_TYPES = frozenset({LLM_REQUESTED, LLM_RESPONDED, TOOL_REQUESTED, TOOL_RESPONDED})

# Execution status and replayability (the four replayability states).
STATUS_RUNNING = "running"
STATUS_COMPLETED = "completed"
STATUS_INCOMPLETE = "incomplete"
STATUS_INVALIDATED = "invalidated"
STATUSES = (STATUS_RUNNING, STATUS_COMPLETED, STATUS_INCOMPLETE, STATUS_INVALIDATED)

REASON_EXECUTION_INCOMPLETE = "execution_incomplete"
REASON_RECORDING_FAILURE = "recording_failure"
REASON_MANUALLY_INVALIDATED = "manually_invalidated"
REASON_RECORD_CORRUPTED = "record_corrupted"
# What redaction writes in place of a secret: the whole value for a key rule, the matched text
# for a pattern (see tracedb.records.redaction).
REDACTED = "[REDACTED]"

REPLAYABLE_REASONS = (
    REASON_EXECUTION_INCOMPLETE,
    REASON_RECORDING_FAILURE,
    REASON_MANUALLY_INVALIDATED,
    REASON_RECORD_CORRUPTED,
)

# Why a record is not replayable, weakest first: a later transition never puts a weaker reason
# (nor replayable, the weakest of all) in place of a stronger one. An execution that lost records
# and was then closed incomplete (by the sweeper, a clean stop, recovery) still says that records
# were lost, and a finish never makes it replayable.
REASON_RANK = {
    None: 0,
    REASON_EXECUTION_INCOMPLETE: 1,
    REASON_RECORDING_FAILURE: 2,
    REASON_RECORD_CORRUPTED: 3,
    REASON_MANUALLY_INVALIDATED: 4,
}
# The statuses a recording_failure flag applies to: an execution recovery closed after records
# of it were dropped is flagged all the same; an invalidated one says so already.
FLAGGABLE_STATUSES = (STATUS_RUNNING, STATUS_COMPLETED, STATUS_INCOMPLETE)


def keeps_reason(current: Optional[str], new: Optional[str]) -> bool:
    """Whether a record whose reason is `current` keeps it (and its note) when a transition
    would set `new` (None: replayable)."""
    return REASON_RANK.get(current, 0) > REASON_RANK.get(new, 0)


@dataclass(frozen=True)
class LostRecords:
    """What a client that failed open told the recorder it dropped: how many records, and the
    first and last drop (ISO 8601 UTC; None in the notes of older clients)."""

    count: int
    first: Optional[str] = None
    last: Optional[str] = None

    def to_dict(self) -> dict:
        return {"count": self.count, "first": self.first, "last": self.last}

    def words(self) -> str:
        """One line for people: "3 records lost between ... and ..."."""
        n = f"{self.count} record{'' if self.count == 1 else 's'} lost"
        return n if self.first is None else f"{n} between {self.first} and {self.last}"


_OUTAGE_CAUSE = "the recorder was unreachable and the client failed open (on_outage=continue)"


def lost_records_note(count: int, first_ns: int, last_ns: int) -> str:
    """The status note of an execution flagged recording_failure by a client that dropped
    `count` of its records between `first_ns` and `last_ns` (ns since the epoch);
    `lost_records` reads it back."""
    return f"{LostRecords(count, utc_iso(first_ns), utc_iso(last_ns)).words()}: {_OUTAGE_CAUSE}"


_LOST_NOTE = re.compile(r"(\d+) records? lost between (\S+Z) and (\S+Z): ")
_OLDER_LOST_NOTE = re.compile(r"(\d+) record\(s\) of this execution were not recorded\b")


def lost_records(note: Optional[str]) -> Optional[LostRecords]:
    """The counts in a status note `lost_records_note` wrote (or an older client's "N record(s)
    of this execution were not recorded"); None for any other note."""
    if not note or not note[:1].isdigit():
        return None
    m = _LOST_NOTE.match(note)
    if m is not None:
        return LostRecords(int(m.group(1)), m.group(2), m.group(3))
    m = _OLDER_LOST_NOTE.match(note)
    return LostRecords(int(m.group(1))) if m is not None else None


def utc_iso(ns: int, *, timespec: str = "microseconds") -> str:
    """Nanoseconds since the epoch as ISO 8601 UTC with a trailing Z (IntentusNet's form)."""
    dt = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return dt.replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


def redacted_paths(value: Any, path: str = "$") -> list:
    """The paths inside `value` whose string is, or contains, the REDACTED marker."""
    if isinstance(value, str):
        return [path] if REDACTED in value else []
    found: list = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += redacted_paths(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += redacted_paths(v, f"{path}[{i}]")
    return found


def compute_envelope_hash(envelope: dict) -> str:
    """Hash an intent envelope exactly as IntentusNet does: routingMetadata left out, canonical JSON."""
    stable = {k: v for k, v in envelope.items() if k != "routingMetadata"}
    canonical = _canonical_fast(stable)
    if canonical is None:
        canonical = json.dumps(
            stable,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
            default=str,
        ).encode()
    return f"sha256:{hashlib.sha256(canonical).hexdigest()}"


_I64 = 1 << 63


def _plain(value: Any) -> bool:
    """Whether `value` holds only what orjson writes exactly as the canonical `json.dumps`:
    dicts with str keys, lists, str, bool, None and ints within 64 bits. Floats (their exponent
    form differs), tuples, subclasses and anything `default=str` would turn into text are not."""
    t = type(value)
    if t is str or t is bool or value is None:
        return True
    if t is int:
        return -_I64 <= value < _I64
    if t is dict:
        for k, v in value.items():
            if type(k) is not str or not _plain(v):
                return False
        return True
    if t is list:
        for v in value:
            if not _plain(v):
                return False
        return True
    return False


def _canonical_fast(stable: dict) -> Optional[bytes]:
    """The canonical JSON of `stable` through orjson (about 15x faster) when the text is
    byte-for-byte what `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=True)`
    writes: plain values (`_plain`), ASCII and no DEL (json escapes those). None otherwise."""
    try:
        if not _plain(stable):
            return None
    except RecursionError:  # a value that holds itself: json.dumps names it ("Circular reference")
        return None
    try:
        out = orjson.dumps(stable, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None
    # json escapes everything outside " " to "~", DEL (0x7f) included; orjson writes DEL as is.
    return out if out.isascii() and b"\x7f" not in out else None


def normalize_envelope_hash(value: Optional[str]) -> Optional[str]:
    """Accept a bare hex digest (IntentusNet writes those) beside the "sha256:"-prefixed form."""
    if value is None:
        return None
    if value.startswith("sha256:"):
        return value
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower()):
        return "sha256:" + value.lower()
    return value


def stored_envelope_hash(envelope_hash: Optional[str], meta: Any) -> Optional[str]:
    """The hash the stored envelope must have: the recorded one, or, when redaction rewrote the
    envelope before it was stored, the hash of the envelope as stored (kept in `meta`). The
    recorded hash stays the one of the envelope as sent, which replay with it checks."""
    redaction = meta.get("redaction") if isinstance(meta, dict) else None
    if isinstance(redaction, dict) and isinstance(redaction.get("envelopeHash"), str):
        return normalize_envelope_hash(redaction["envelopeHash"])
    return normalize_envelope_hash(envelope_hash)


@dataclass
class ExecutionEvent:
    seq: int
    type: str
    payload: Any

    def to_dict(self) -> dict:
        return {"seq": self.seq, "type": self.type, "payload": self.payload}

    @property
    def error(self) -> Optional[dict]:
        """{code, message} of the error this event records (a failed call), else None
        (`tracedb.records.outcomes.event_error`, computed on read)."""
        # Lazy seam: `import tracedb` does without the outcomes' price table (decimal, genai-prices).
        from tracedb.records.outcomes import event_error

        return event_error(self.type, self.payload)


@dataclass
class ExecutionHeader:
    executionId: str
    createdUtcIso: str
    envelopeHash: Optional[str]
    replayable: bool
    replayableReason: Optional[str]

    def to_dict(self) -> dict:
        return {
            "executionId": self.executionId,
            "createdUtcIso": self.createdUtcIso,
            "envelopeHash": self.envelopeHash,
            "replayable": self.replayable,
            "replayableReason": self.replayableReason,
        }


@dataclass
class ExecutionRecord:
    """One execution: header, envelope, router decision, events in seq order, final response.

    `status`, `intent` and the lineage fields are tracedb's additions beside IntentusNet's shape;
    `to_dict()` carries them under their own keys and never changes IntentusNet's keys.
    """

    header: ExecutionHeader
    envelope: dict
    routerDecision: Optional[dict] = None
    events: list[ExecutionEvent] = field(default_factory=list)
    finalResponse: Optional[dict] = None
    status: str = STATUS_RUNNING
    intent: Optional[str] = None
    parentExecutionId: Optional[str] = None
    forkedAtSeq: Optional[int] = None
    # What the record says about itself beyond IntentusNet's shape (the `meta` column): the
    # stored envelope's hash when redaction rewrote it, an imported header as it was written.
    meta: Optional[dict] = None

    @property
    def execution_id(self) -> str:
        return self.header.executionId

    @property
    def last_event(self) -> Optional[ExecutionEvent]:
        return self.events[-1] if self.events else None

    def to_dict(self) -> dict:
        out = {
            "header": self.header.to_dict(),
            "envelope": self.envelope,
            "routerDecision": self.routerDecision,
            "events": [e.to_dict() for e in self.events],
            "finalResponse": self.finalResponse,
            "status": self.status,
            "intent": self.intent,
        }
        if self.parentExecutionId is not None:
            out["lineage"] = {
                "parentExecutionId": self.parentExecutionId,
                "forkedAtSeq": self.forkedAtSeq,
            }
        redacted = self.redacted_paths()
        if redacted:
            out["redacted"] = redacted
        return out

    def redacted_paths(self) -> dict:
        """Where redaction rewrote this record: {"envelope": [paths], "events": {seq: [paths]},
        "finalResponse": [paths]}, each part present only when it holds a redacted value. A path
        is "$" then ".key" and "[index]" steps; the value there is, or contains, REDACTED."""
        out: dict = {}
        env = redacted_paths(self.envelope)
        if env:
            out["envelope"] = env
        events = {}
        for e in self.events:
            if e.type == FINAL_RESPONSE:
                continue
            paths = redacted_paths(e.payload)
            if paths:
                events[str(e.seq)] = paths
        if events:
            out["events"] = events
        final = redacted_paths(self.finalResponse)
        if final:
            out["finalResponse"] = final
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ExecutionRecord":
        """Build a record from `to_dict()` output (or an IntentusNet record of the same shape)."""
        h = data["header"]
        lineage = data.get("lineage") or {}
        return cls(
            header=ExecutionHeader(
                executionId=h["executionId"],
                createdUtcIso=h.get("createdUtcIso", ""),
                envelopeHash=normalize_envelope_hash(h.get("envelopeHash")),
                replayable=bool(h.get("replayable", False)),
                replayableReason=h.get("replayableReason"),
            ),
            envelope=data.get("envelope") or {},
            routerDecision=data.get("routerDecision"),
            events=[
                ExecutionEvent(seq=e["seq"], type=e["type"], payload=e.get("payload"))
                for e in data.get("events") or []
            ],
            finalResponse=data.get("finalResponse"),
            status=data.get("status")
            or (STATUS_COMPLETED if data.get("finalResponse") is not None else STATUS_INCOMPLETE),
            intent=data.get("intent"),
            parentExecutionId=lineage.get("parentExecutionId"),
            forkedAtSeq=lineage.get("forkedAtSeq"),
        )
