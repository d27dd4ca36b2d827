"""IntentusNet's execution records in and out of tracedb.

IntentusNet (`pip install intentusnet`) keeps one JSON file per execution (its FileExecutionStore:
DIR/<executionId>.json, the shape of IntentusNet's ExecutionRecord). This module maps that record onto
tracedb's recording API and back:

    from intentusnet import IntentRouter
    from tracedb.interop.intentusnet import TraceDBExecutionStore

    store = tracedb.open(".tracedb")
    router = IntentRouter(registry, record_store=TraceDBExecutionStore(store))
    router.route_intent(env)              # the execution goes through tracedb's WAL, durably
    record = TraceDBExecutionStore(store).load(execution_id)   # an intentusnet ExecutionRecord
    intentusnet.ReplayEngine(record).replay(env=env)

Writing a record checks all of it first (a refusal writes nothing), then appends its start, its
events and its finish in one WAL append (`Store.record_execution`). tracedb stores only what it can
give back exactly, and refuses anything else with the reason:

- no NaN or infinity, no integer outside -2**63..2**64-1 (see tracedb.records.validation);
- events must be numbered 1, 2, 3, ... (tracedb assigns seq itself);
- a FINAL_RESPONSE event, if any, is the last one and its payload is the finalResponse (tracedb
  records the final response as that event); routerDecision is the last ROUTER_DECISION payload;
- the envelope hash must match the envelope, in either form: tracedb's (IntentusNet's: "sha256:" +
  hex, routingMetadata left out) or IntentusNet's own (bare hex of the whole envelope, which is
  what the intentusnet package writes); bare hex is accepted beside the prefixed form.

Event types tracedb does not know (neither IntentusNet's, nor LLM/tool calls, nor namespaced) are stored as
"intentusnet.<type>" and given back without the prefix. A record without a final response is
stored as incomplete (execution_incomplete); one IntentusNet marked not replayable keeps that as
manually_invalidated, or else recording_failure (the original reason goes into the trace's note).
The header as written (createdUtcIso, replayable, replayableReason) is kept in the trace's meta.
Each event's recordedUtcIso (IntentusNet has none; tracedb's export adds it) is kept as the
time the event was recorded; a record whose events have none gets its creation time for each.

Reading back, the record is in IntentusNet's form: header.envelopeHash is IntentusNet's hash of
the stored envelope (what its ReplayEngine compares with); createdUtcIso, replayable and
replayableReason are an imported record's own, as long as its state is the one the import gave
it (else createdUtcIso is ISO 8601 with "+00:00" and the rest tracedb's). Saving an id again is a
no-op for the same record and ExecutionExistsError for any difference. If the stored envelope no longer matches tracedb's own hash, the record comes back not
replayable, reason record_corrupted, so that no corrupted envelope is laundered into a fresh hash.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

import orjson

from tracedb.errors import (
    ExecutionExistsError,
    ExecutionNotFoundError,
    IntegrityError,
    InvalidInputError,
    RecordNotFoundError,  # re-exported: the adapter's public name (its old home)
    TraceDBError,
    UsageError,
)
from tracedb.program import pip_install
from tracedb.reads.reader import list_traces, read_record
from tracedb.records.record import (
    FINAL_RESPONSE,
    REASON_EXECUTION_INCOMPLETE,
    REASON_MANUALLY_INVALIDATED,
    REASON_RECORD_CORRUPTED,
    REASON_RECORDING_FAILURE,
    ROUTER_DECISION,
    ExecutionRecord,
    compute_envelope_hash,
    normalize_envelope_hash,
    stored_envelope_hash,
)
from tracedb.records.validation import MAX_DEPTH, validate_event_type

TYPE_PREFIX = "intentusnet."
# The time an event was recorded, which tracedb's export adds to each event (IntentusNet's own
# events have none, and its ExecutionRecord.from_dict reads past it).
EVENT_TIME_KEY = "recordedUtcIso"
_BARE_TYPE = re.compile(r"[A-Za-z0-9_-]+")  # fullmatch
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")  # fullmatch
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

try:  # Subclass IntentusNet's interface when it is installed, so isinstance checks pass.
    from intentusnet.recording.models import ExecutionRecord as IntentusNetRecord
    from intentusnet.recording.store import ExecutionStore as _ExecutionStoreBase
except ImportError:  # pragma: no cover - exercised only without the package
    IntentusNetRecord = None
    _ExecutionStoreBase = object


# -- hashes and plain values ----------------------------------------------------------------


def to_plain(value: Any) -> Any:
    """Dataclasses, enums, tuples as JSON values, as IntentusNet's own recording does (enum:
    its value when str or int, else its name). The router's records hold live objects (an
    ErrorInfo in an error response); this is the JSON its FileExecutionStore would write."""
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value.value, (str, int)) else value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def intentusnet_envelope_hash(envelope: dict) -> str:
    """IntentusNet's envelope hash: bare hex sha256 of the whole envelope (routingMetadata
    included) as canonical JSON; the same as `intentusnet.recording.models.stable_hash`."""
    encoded = json.dumps(
        to_plain(envelope), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()


def check_envelope_hash(envelope: dict, given: Optional[str]) -> Optional[str]:
    """Which form `given` is ("tracedb" or "intentusnet"; None when there is no hash to check);
    IntegrityError when it matches the envelope in neither form."""
    if given is None or given == "":
        return None
    if not isinstance(given, str):
        raise InvalidInputError(f"header.envelopeHash must be a string, not {type(given).__name__}")
    if normalize_envelope_hash(given) == compute_envelope_hash(envelope):
        return "tracedb"
    bare = given[len("sha256:"):] if given.startswith("sha256:") else given
    if _HEX64.fullmatch(bare) and bare.lower() == intentusnet_envelope_hash(envelope):
        return "intentusnet"
    raise IntegrityError(
        f"envelope hash {given} does not match the envelope (tracedb computes "
        f"{compute_envelope_hash(envelope)}, IntentusNet {intentusnet_envelope_hash(envelope)})",
        hint="the envelope was changed after it was recorded, or the hash was made some other way; "
        "the record is not imported",
    )


def _iso_to_ns(text: Any, name: str = "header.createdUtcIso") -> int:
    if not isinstance(text, str):
        raise InvalidInputError(f"{name} must be an ISO 8601 string, got {text!r}")
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(
            f"{name} {text!r} is not an ISO 8601 time",
            hint="IntentusNet writes datetime.now(timezone.utc).isoformat(), e.g. 2024-01-15T10:30:00.123456+00:00",
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    # Integer arithmetic: a float timestamp would lose the microseconds of a 2020s date.
    return (dt - _EPOCH) // timedelta(microseconds=1) * 1000


def _ns_to_iso(ns: int) -> str:
    return (_EPOCH + timedelta(microseconds=ns // 1000)).isoformat()


def _tracedb_iso_to_intentusnet(text: str) -> str:
    try:
        return _ns_to_iso(_iso_to_ns(text))
    except InvalidInputError:
        return text


# -- IntentusNet record -> tracedb ------------------------------------------------------------


@dataclass(frozen=True)
class ParsedRecord:
    """An IntentusNet record checked and mapped onto tracedb's recording calls."""

    execution_id: str
    intent: str
    envelope: dict
    created_at_ns: int
    events: tuple  # ((type, payload), ...) in seq order, FINAL_RESPONSE excluded
    final_response: Optional[dict]
    # None: replayable; else (tracedb state, original reason): "invalidated" or "recording_failure"
    not_replayable: Optional[tuple] = None
    router_decision: Any = None
    envelope_hash_form: Optional[str] = field(default=None, compare=False)
    # When each event was recorded (ns), FINAL_RESPONSE included: the events' recordedUtcIso;
    # None when the record carries none.
    recorded_at_ns: Optional[tuple] = None


def tracedb_event_type(type_: Any, seq: int) -> str:
    """The tracedb event type an IntentusNet event type is stored as (see the module doc)."""
    if not isinstance(type_, str) or not type_:
        raise InvalidInputError(f"event {seq}: type must be a non-empty string, got {type_!r}")
    if type_.startswith(TYPE_PREFIX):
        # Prefixed once more so that reading back (which strips one prefix) gives it unchanged.
        return TYPE_PREFIX + type_
    try:
        return validate_event_type(type_)
    except InvalidInputError:
        if _BARE_TYPE.fullmatch(type_) and len(TYPE_PREFIX) + len(type_) <= 128:
            return TYPE_PREFIX + type_
        raise InvalidInputError(
            f"event {seq}: type {type_!r} can be stored neither as it is nor as {TYPE_PREFIX}{type_}",
            hint="event types are letters, digits, '_', '-' and '.' separated parts",
        ) from None


def parse_record(data: Any) -> ParsedRecord:
    """Check an IntentusNet record (its `to_dict()` or a FileExecutionStore file's JSON) and map
    it onto tracedb; InvalidInputError / IntegrityError say what cannot be stored exactly."""
    if not isinstance(data, dict) or not isinstance(data.get("header"), dict):
        raise InvalidInputError("not an IntentusNet execution record: no header object")
    h = data["header"]
    eid = h.get("executionId")
    if not isinstance(eid, str) or not eid:
        raise InvalidInputError("header.executionId is missing")
    envelope = data.get("envelope")
    if not isinstance(envelope, dict):
        raise InvalidInputError(f"{eid}: envelope must be an object")
    form = check_envelope_hash(envelope, h.get("envelopeHash"))
    created = _iso_to_ns(h.get("createdUtcIso"))
    raw_events = data.get("events") or []
    if not isinstance(raw_events, list):
        raise InvalidInputError(f"{eid}: events must be a list")
    final = data.get("finalResponse")
    if final is not None and not isinstance(final, dict):
        raise InvalidInputError(f"{eid}: finalResponse must be an object or null")
    events = []
    final_event = None
    last_decision = None
    times = _event_times(eid, raw_events)
    for i, e in enumerate(raw_events, start=1):
        if not isinstance(e, dict) or type(e.get("seq")) is not int or e["seq"] != i:
            got = e.get("seq") if isinstance(e, dict) else e
            raise InvalidInputError(
                f"{eid}: event {i} has seq {got!r}; tracedb numbers events 1, 2, 3, ... and would "
                "not give these seqs back",
            )
        if final_event is not None:
            raise InvalidInputError(f"{eid}: event {i} comes after FINAL_RESPONSE")
        type_, payload = e.get("type"), e.get("payload")
        if type_ == FINAL_RESPONSE:
            final_event = payload
            continue
        if type_ == ROUTER_DECISION:
            last_decision = payload
        events.append((tracedb_event_type(type_, i), payload))
    if final_event is not None and final_event != final:
        raise InvalidInputError(
            f"{eid}: the FINAL_RESPONSE event's payload differs from finalResponse",
            hint="tracedb records the final response as the FINAL_RESPONSE event's payload and "
            "could not give both back",
        )
    if final is not None and final_event is None:
        raise InvalidInputError(
            f"{eid}: finalResponse without a FINAL_RESPONSE event",
            hint="tracedb would add that event and not give the record back as it was",
        )
    decision = data.get("routerDecision")
    if decision != last_decision:
        raise InvalidInputError(
            f"{eid}: routerDecision is not the payload of the last ROUTER_DECISION event",
            hint="tracedb derives routerDecision from that event",
        )
    not_replayable = None
    if final is not None and not h.get("replayable", True):
        reason = h.get("replayableReason") or "marked not replayable"
        state = "invalidated" if reason == REASON_MANUALLY_INVALIDATED else "recording_failure"
        not_replayable = (state, str(reason))
    intent = envelope.get("intent")
    if isinstance(intent, dict):
        intent = intent.get("name")
    if not isinstance(intent, str) or not intent:
        intent = "unknown"
    return ParsedRecord(
        execution_id=eid, intent=intent, envelope=envelope, created_at_ns=created,
        events=tuple(events), final_response=final, not_replayable=not_replayable,
        router_decision=decision, envelope_hash_form=form, recorded_at_ns=times,
    )


def _event_times(eid: str, raw_events: list) -> Optional[tuple]:
    """The events' recordedUtcIso as ns (what `tracedb export` writes beside IntentusNet's
    fields), or None when no event has one; every event or none."""
    given = [e.get(EVENT_TIME_KEY) if isinstance(e, dict) else None for e in raw_events]
    if all(t is None for t in given):
        return None
    if any(t is None for t in given):
        raise InvalidInputError(
            f"{eid}: some events have {EVENT_TIME_KEY} and some not",
            hint="give every event its recorded time, or none (the events then take the creation time)",
        )
    return tuple(_iso_to_ns(t, f"event {i} {EVENT_TIME_KEY}") for i, t in enumerate(given, start=1))


def record_dict(record: Any) -> dict:
    """An IntentusNet ExecutionRecord (or its dict) as plain JSON values."""
    if not isinstance(record, dict):
        to_dict = getattr(record, "to_dict", None)
        if to_dict is None:
            raise InvalidInputError(
                f"expected an IntentusNet ExecutionRecord or its dict, not {type(record).__name__}"
            )
        record = to_dict()
    try:
        return to_plain(record)
    except RecursionError:
        # Far deeper than any value the store takes (tracedb.records.validation.MAX_DEPTH): refused
        # like one, not a crash of the whole import.
        raise InvalidInputError(
            f"the record is nested deeper than {MAX_DEPTH} levels", hint="flatten the deep part of it"
        ) from None


HEADER_KEYS = ("createdUtcIso", "envelopeHash", "replayable", "replayableReason")


def header_meta(header: dict) -> dict:
    """The header fields kept as written in the trace's `meta` (under "intentusnet"), so that
    export gives them back byte for byte: the time's own spelling ("Z" or "+00:00", its
    digits), the hash's form, a custom not-replayable reason."""
    return {k: header.get(k) for k in HEADER_KEYS}


def _closing(p: ParsedRecord) -> tuple:
    if p.final_response is None:
        return (("incomplete", "imported without a final response"),)
    if p.not_replayable is not None:
        state, reason = p.not_replayable
        op = "invalidate" if state == "invalidated" else "recording_failure"
        return ((op, f"imported from IntentusNet: {reason}"),)
    return ()


def is_client(store) -> bool:
    """True for a recording client (`tracedb.client.connect()`: a sidecar, `tracedb serve`),
    False for the embedded store (`tracedb.open`)."""
    # A client exists only once its module is loaded: telling one needs no import (which would
    # load the client, and asyncio, for the embedded store).
    client = sys.modules.get("tracedb.sidecar.client")
    return client is not None and isinstance(store, client.Client)


def start_execution(store, p: ParsedRecord, meta: dict):
    """Start recording `p`'s execution (no events) through a store or a client; its handle.

    A client's start carries no creation time and no meta (the protocol has neither): the
    execution's creation time is the recorder's, and `createdUtcIso` reads back as that."""
    if is_client(store):
        return store.start(p.intent, p.envelope, p.execution_id)
    return store.start(p.intent, p.envelope, p.execution_id, created_at_ns=p.created_at_ns, meta=meta)


def _write_through_client(client, p: ParsedRecord) -> None:
    """Record `p` through a client: its start, each event, its finish, its closing, each durable
    before the next is sent (the protocol has no one-append write of a whole record, so a value
    the recorder refuses leaves what came before it recorded). ExecutionExistsError when the id
    is taken."""
    try:
        client.get(p.execution_id)
    except ExecutionNotFoundError:
        pass
    else:
        raise ExecutionExistsError(p.execution_id)
    ex = start_execution(client, p, {})
    for type_, payload in p.events:
        ex.event(type_, payload)
    if p.final_response is not None:
        ex.finish(p.final_response)
    close = {"incomplete": client.abandon, "invalidate": client.invalidate,
             "recording_failure": client.mark_recording_failure}
    for op, reason in _closing(p):
        close[op](p.execution_id, reason)


def write_record(store, data: Any) -> str:
    """Record an IntentusNet record into a tracedb `Store` (or through a client); returns
    "imported", or "present" when the store holds the same record already (header included).
    ExecutionExistsError when it holds another one under that id: a record is never silently
    replaced or dropped.

    The whole record is checked before anything is written (`Store.record_execution`): a record
    refused for any reason leaves nothing behind, and importing it again once fixed works."""
    data = record_dict(data)
    p = parse_record(data)
    try:
        if is_client(store):
            _write_through_client(store, p)
        else:
            n = len(p.events) + (p.final_response is not None)
            meta = header_meta(data["header"])
            if p.recorded_at_ns is not None:
                meta["eventTimes"] = True  # export gives them back; else it leaves them out
            store.record_execution(
                p.intent, p.envelope, p.execution_id, events=p.events, response=p.final_response,
                closing=_closing(p), created_at_ns=p.created_at_ns, meta={"intentusnet": meta},
                recorded_at_ns=p.recorded_at_ns or (p.created_at_ns,) * n,
            )
    except ExecutionExistsError:
        difference = _difference(store, p, data)
        if difference is None:
            return "present"
        raise ExecutionExistsError(
            p.execution_id,
            hint=f"tracedb holds another record under this id ({difference}); a recorded execution "
            "is never replaced: import the changed record under a new executionId",
        ) from None
    return "imported"


def _as_stored(store, p: ParsedRecord, data: dict) -> dict:
    """`data` as the store records it: redacted by the store's rules for its intent."""
    redact = getattr(store, "redact_for", None)
    if redact is None:
        return data
    out = dict(data)
    out["envelope"] = redact(p.intent, data.get("envelope"))
    out["events"] = [
        {**e, "payload": redact(p.intent, e.get("payload"))} if isinstance(e, dict) else e
        for e in data.get("events") or []
    ]
    out["finalResponse"] = redact(p.intent, data.get("finalResponse"))
    out["routerDecision"] = redact(p.intent, data.get("routerDecision"))
    return out


def _json(value: Any) -> bytes:
    # Strict: `True == 1` and `1 == 1.0` in Python, not in a record given back byte for byte.
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _difference(store, p: ParsedRecord, data: dict) -> Optional[str]:
    """None when the store holds exactly `data` under its id, else what differs."""
    mine = to_intentusnet_dict(store.get(p.execution_id))
    given = _as_stored(store, p, data)
    for key in ("header", "envelope", "routerDecision", "finalResponse"):
        if key == "header":
            # envelopeHash: parse_record checked the given one against the envelope, compared
            # below; it may come in any of the accepted forms.
            for hk in ("executionId", "createdUtcIso", "replayable", "replayableReason"):
                if _json(mine["header"].get(hk)) != _json((given.get("header") or {}).get(hk)):
                    return f"header.{hk} differs"
        elif _json(mine[key]) != _json(given.get(key)):
            return f"{key} differs"
    theirs = [
        {"seq": e.get("seq"), "type": e.get("type"), "payload": e.get("payload")}
        for e in given.get("events") or []
    ]
    if len(mine["events"]) != len(theirs):
        return f"{len(mine['events'])} events recorded, {len(theirs)} given"
    for a, b in zip(mine["events"], theirs):
        if _json(a) != _json(b):
            return f"event {a['seq']} differs"
    return None


# -- tracedb -> IntentusNet record -------------------------------------------------------------


def _imported_state(record: ExecutionRecord, original: dict) -> tuple:
    """The (replayable, reason) an import gave a record with this original header."""
    if record.finalResponse is None:
        return False, REASON_EXECUTION_INCOMPLETE
    if not original.get("replayable", True):
        if original.get("replayableReason") == REASON_MANUALLY_INVALIDATED:
            return False, REASON_MANUALLY_INVALIDATED
        return False, REASON_RECORDING_FAILURE
    return True, None


def _bare(h: Optional[str]) -> Optional[str]:
    return h[len("sha256:"):] if h and h.startswith("sha256:") else h


def to_intentusnet_dict(record: ExecutionRecord, times: Optional[dict] = None) -> dict:
    """A tracedb record in IntentusNet's JSON shape (what its FileExecutionStore writes and its
    `ExecutionRecord.from_dict` reads); see the module doc for the header. An imported record
    comes back with its header as it was written (kept in the trace's meta), unless its state
    changed since (an operator invalidated it, or its envelope no longer verifies).

    `times` ({seq: recorded ns}) adds each event's recordedUtcIso, unless the record was imported
    from a file whose events had none (it comes back as it was)."""
    envelope = record.envelope
    replayable = record.header.replayable
    reason = record.header.replayableReason
    meta = record.meta or {}
    redaction = meta.get("redaction") or {}
    original = meta.get("intentusnet") or {}
    stored = normalize_envelope_hash(record.header.envelopeHash)
    try:
        # A redacted envelope is checked against the hash of the envelope as stored.
        intact = stored_envelope_hash(stored, meta) == compute_envelope_hash(envelope)
        ihash = _bare(stored) if redaction else intentusnet_envelope_hash(envelope)
    except (TypeError, ValueError):
        intact, ihash = False, None
    created = _tracedb_iso_to_intentusnet(record.header.createdUtcIso)
    if isinstance(original.get("createdUtcIso"), str):
        created = original["createdUtcIso"]
    if redaction and original.get("envelopeHash"):
        # IntentusNet's hash of the envelope as sent cannot be computed from the redacted one.
        ihash = _bare(original["envelopeHash"])
    if "replayable" in original and (bool(replayable), reason) == _imported_state(record, original):
        replayable, reason = original["replayable"], original.get("replayableReason")
    if not intact:
        replayable, reason = False, REASON_RECORD_CORRUPTED
        ihash = _bare(stored)
    events = []
    if "replayable" in original and not original.get("eventTimes"):
        times = None  # imported (the whole header kept) from a file whose events had no time
    for e in record.events:
        t = e.type[len(TYPE_PREFIX):] if e.type.startswith(TYPE_PREFIX) else e.type
        events.append({"seq": e.seq, "type": t, "payload": e.payload})
        if times is not None and e.seq in times:
            events[-1][EVENT_TIME_KEY] = _ns_to_iso(times[e.seq])
    return {
        "header": {
            "executionId": record.header.executionId,
            "createdUtcIso": created,
            "envelopeHash": ihash,
            "replayable": replayable if isinstance(replayable, bool) else bool(replayable),
            "replayableReason": reason,
        },
        "envelope": envelope,
        "routerDecision": record.routerDecision,
        "events": events,
        "finalResponse": record.finalResponse,
    }


def to_intentusnet_record(record: ExecutionRecord):
    """The same as an `intentusnet.recording.models.ExecutionRecord` (needs the package)."""
    if IntentusNetRecord is None:
        raise UsageError(
            "the intentusnet package is not installed",
            hint=f"`{pip_install('intentusnet')}`, or use to_intentusnet_dict() for its JSON form",
        )
    return IntentusNetRecord.from_dict(to_intentusnet_dict(record))


# -- the adapter ---------------------------------------------------------------------------------


class TraceDBExecutionStore(_ExecutionStoreBase):
    """IntentusNet's ExecutionStore (save, load, list_ids) over a tracedb store.

    Give it to `IntentRouter(registry, record_store=...)`: each routed intent is recorded
    through tracedb's WAL (start, events, finish) before `route_intent` returns. `store` is a
    `tracedb.Store` (`tracedb.open(...)`), or a recording client (`tracedb.client.connect()`),
    which records through `tracedb serve` while it holds the data directory; for reading only,
    `TraceDBExecutionStore.reader(engine)` reads a database (SQLite or PostgreSQL) without
    taking a data directory.
    """

    def __init__(self, store, *, engine=None):
        if store is None and engine is None:
            raise UsageError(
                "TraceDBExecutionStore needs a store (tracedb.open(...)), a client (tracedb.client.connect()) "
                "or, to read only, an engine",
                hint="TraceDBExecutionStore(tracedb.open(data_dir)), or TraceDBExecutionStore.reader(engine)",
            )
        self._store = store
        self._engine = engine
        # Executions a LiveRouter is recording through this adapter, by id, until the router
        # saves them (tracedb.interop.intentusnet_live).
        self.live: dict = {}

    @property
    def store(self):
        """The tracedb Store or client it records into (None for a reader)."""
        return self._store

    @classmethod
    def reader(cls, engine) -> "TraceDBExecutionStore":
        """A read-only adapter over a database engine (`tracedb.projection.db.create_engine(url)`)."""
        return cls(None, engine=engine)

    def save(self, record) -> str:
        """Record an IntentusNet ExecutionRecord durably; returns its execution id.

        Saving the same record again is a no-op; another record under the same id is refused
        (ExecutionExistsError). A record tracedb could not give back exactly is refused too
        (see the module doc), so that nothing is stored altered without anyone knowing.
        """
        if self._store is None:
            raise UsageError("this TraceDBExecutionStore reads only", hint="give it a tracedb Store to save")
        live = self.live.pop(getattr(getattr(record, "header", None), "executionId", None), None)
        if live is not None and live.get_record() is record:
            return live.close()
        data = record_dict(record)
        write_record(self._store, data)
        return data["header"]["executionId"]

    def _read(self, execution_id: str) -> ExecutionRecord:
        if self._store is not None:
            return self._store.get(execution_id)
        return read_record(self._engine, execution_id)

    def load(self, execution_id: str):
        """The execution as an IntentusNet ExecutionRecord; RecordNotFoundError (a
        FileNotFoundError too) if tracedb has no such execution."""
        try:
            record = self._read(execution_id)
        except ExecutionNotFoundError:
            raise RecordNotFoundError(execution_id) from None
        return to_intentusnet_record(record)

    def list_ids(self) -> list:
        """Every execution id in the store, sorted (as IntentusNet's FileExecutionStore does)."""
        if self._store is not None and is_client(self._store):
            raise UsageError(
                "a recording client cannot list executions (the sidecar's protocol has no listing)",
                hint="list them from the database: TraceDBExecutionStore.reader(tracedb.projection.db.create_engine(url)), "
                "or `tracedb inspect --list`",
            )
        if self._store is not None:
            rows = self._store.list()
        else:
            rows = list_traces(self._engine)
        return sorted(r.execution_id for r in rows)


# -- import of a FileExecutionStore directory ----------------------------------------------------


@dataclass(frozen=True)
class ImportResult:
    """What `import_directory` did: records imported, already present (identical), and the
    files it could not import with the reason for each."""

    imported: int = 0
    already_present: int = 0
    events: int = 0
    failed: tuple = ()  # ((file name, message), ...)

    @property
    def ok(self) -> bool:
        """True when every file was imported (or was there already)."""
        return not self.failed


def record_files(directory: str) -> list[str]:
    """The record files of an IntentusNet FileExecutionStore directory (DIR/*.json), sorted."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        raise InvalidInputError(
            f"{directory} does not exist", hint="give the directory IntentusNet's FileExecutionStore writes to"
        ) from None
    except NotADirectoryError:
        raise InvalidInputError(f"{directory} is not a directory") from None
    return sorted(n for n in names if n.endswith(".json"))


def _import_file(store, directory: str, name: str) -> tuple[str, int]:
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"cannot read {name}: {e}") from None
    except RecursionError:
        raise InvalidInputError(f"cannot read {name}: it is nested deeper than {MAX_DEPTH} levels") from None
    eid = data.get("header", {}).get("executionId") if isinstance(data, dict) else None
    if isinstance(eid, str) and eid + ".json" != name:
        raise InvalidInputError(
            f"{name} holds execution {eid!r}; IntentusNet would look for it in {eid}.json",
            hint="rename the file after the execution id it holds",
        )
    outcome = write_record(store, data)
    return outcome, len(data.get("events") or [])


def import_directory(
    store,
    directory: str,
    *,
    workers: int = 8,
    progress: Optional[Callable[[int, int], None]] = None,
) -> ImportResult:
    """Import every record file of an IntentusNet FileExecutionStore directory into `store`.

    Records are written by `workers` threads at once, so that their WAL appends share fsyncs
    (group commit); each record on its own is written in order. Idempotent: a record already
    imported unchanged is counted as present. A file that cannot be imported is reported with
    its reason and the others go on.
    """
    names = record_files(directory)
    imported = present = events = done = 0
    failed: list = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [(name, pool.submit(_import_file, store, directory, name)) for name in names]
        for name, fut in futures:
            try:
                outcome, n = fut.result()
            except TraceDBError as e:
                failed.append((name, e.message + (f" (hint: {e.hint})" if e.hint else "")))
            else:
                if outcome == "present":
                    present += 1
                else:
                    imported += 1
                    events += n
            done += 1
            if progress is not None:
                progress(done, len(names))
    return ImportResult(imported, present, events, tuple(failed))
