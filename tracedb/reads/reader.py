"""The one read API over the projection: the CLI, the sidecar's `get` and a web UI share it.

Reads take an engine, never the WAL, so they work next to a running recorder (SQLite's WAL mode
and PostgreSQL's MVCC let readers and the compactor proceed together). The module functions are
the building blocks the store uses too; `Reader` puts them behind one object opened from a
`Config`, with pages of executions (newest first, keyset pagination), execution ids by unique
prefix, records with their event times, diff, lineage and verification.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Iterator, Optional, Sequence, Union

import orjson

from wal.format import crc32c

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from tracedb.maintenance.verify import VerifyResult

from tracedb.imports import on_first_use
from tracedb.projection import checksums
from tracedb.reads import sqlite as sqlite_reads
from tracedb.config import Config
from tracedb.errors import AmbiguousExecutionIdError, ExecutionNotFoundError, InvalidInputError, StoreClosedError, path_exists
from tracedb.reads.paging import DEFAULT_PAGE_SIZE, STREAM_PAGE_SIZE, decode_cursor
from tracedb.records.record import (
    STATUSES,
    ExecutionEvent,
    ExecutionHeader,
    ExecutionRecord,
    utc_iso,
)
from tracedb.reads.wal_tail import Pending, unheld_wal
from tracedb.reads.wal_tail import load as load_pending
from tracedb.records.record import (
    REASON_EXECUTION_INCOMPLETE,
    REASON_RECORD_CORRUPTED,
    REASON_RECORDING_FAILURE,
    LostRecords,
    lost_records,
)
from tracedb.replay.exact import ReplayEngine, ReplayResult, record_problems, value_problems
from tracedb.replay.parity import TraceDiff, diff_traces
from tracedb.records.ids import OTEL_PREFIX, PREFIX
from tracedb.records.outcomes import OUTCOMES, event_error
from tracedb.reads.rows import TraceSummary, errored_events, outcome_view
from tracedb.reads.stats import stats as read_stats
from tracedb.records.validation import ID_LENGTH, INTENT_LENGTH

TimeArg = Union[None, int, float, datetime]

# How many candidates an ambiguous prefix error names.
AMBIGUOUS_SHOWN = 5
# How many reads a page of replayable executions makes to replace the rows whose records failed
# verification; past them, the page is short and its cursor continues after the rows read.
REFILLS = 8



# The lazy seams of the read path (`tracedb.imports`). Each loads SQLAlchemy: a read of a current
# SQLite file goes through `tracedb.reads.sqlite` and never does (its import is most of a read
# command's start-up); asyncio waits for the first AsyncReader.
if TYPE_CHECKING:
    import asyncio

    from tracedb.maintenance import verify as verifying
    from tracedb.projection import db
    from tracedb.reads import sql as read_sql
else:
    read_sql = on_first_use("tracedb.reads.sql")  # every read through an engine
    db = on_first_use("tracedb.projection.db")  # the engine, for a database reads.sqlite does not serve
    verifying = on_first_use("tracedb.maintenance.verify")  # also the SQLModel tables (pydantic)
    asyncio = on_first_use("asyncio")  # a read command never awaits


NS_MIN = -(1 << 63)
NS_MAX = (1 << 63) - 1
# A search longer than any intent finds nothing, and SQLite refuses a LIKE pattern past 50,000
# bytes ("LIKE or GLOB pattern too complex"): 1,024 characters escaped stay far below.
SEARCH_LENGTH = INTENT_LENGTH


def position(cursor: str) -> tuple[int, str]:
    """(created_at_ns, execution_id) of a page cursor, as a bound a query can compare with: a
    cursor holding a time past 64 bits, or an id no execution can have, is not one a page wrote."""
    ns, execution_id = decode_cursor(cursor)
    if not NS_MIN <= ns <= NS_MAX or len(execution_id) > ID_LENGTH or "\x00" in execution_id:
        raise InvalidInputError(f"{cursor[:80]!r} is not a page cursor", hint="copy the cursor printed with the previous page")
    return ns, execution_id


def _checked_search(search: Optional[str]) -> Optional[str]:
    if search is not None and len(search) > SEARCH_LENGTH:
        raise InvalidInputError(
            f"the search is {len(search)} characters long; an intent has at most {SEARCH_LENGTH}",
            hint="search for a part of the intent",
        )
    return search


def to_ns(value: TimeArg, name: str) -> Optional[int]:
    """A time argument as nanoseconds: an aware datetime, or seconds since the epoch, within
    what the store's 64-bit times hold (InvalidInputError otherwise)."""
    if value is None:
        return None
    try:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise InvalidInputError(
                    f"{name} must be timezone-aware", hint="use datetime.now(timezone.utc) or an ISO time with Z"
                )
            ns = int(value.timestamp() * 1e9)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            ns = int(value * 1e9)
        else:
            raise InvalidInputError(f"{name} must be a datetime or seconds since the epoch, not {type(value).__name__}")
    except (OverflowError, ValueError):
        ns = None
    if ns is None or not NS_MIN <= ns <= NS_MAX:
        raise InvalidInputError(
            f"{name} is outside the times the store can hold",
            hint="give a time from 1677-09-22 to 2262-04-11 (nanoseconds since 1970 in 64 bits)",
        )
    return ns


def damage(row, steps) -> tuple[list[int], list[str]]:
    """What of a loaded record no longer matches its checksums (`tracedb.projection.checksums`): the seqs
    of the steps whose payload changed, and the `traces` value columns that changed. Rows and
    steps the WAL holds beyond the database carry no checksum (the WAL's CRC covers them)."""
    return [s.seq for s in steps if not getattr(s, "intact", True)], list(getattr(row, "damaged_columns", ()))


def record_from_rows(row, steps) -> ExecutionRecord:
    """Build the ExecutionRecord of a traces row and its steps in seq order. A value that no
    longer matches its checksum (`damage`) makes it not replayable, `record_corrupted`."""
    seqs, columns = damage(row, steps)
    corrupted = bool(seqs or columns)
    return ExecutionRecord(
        header=ExecutionHeader(
            executionId=row.execution_id,
            createdUtcIso=utc_iso(row.created_at_ns),
            envelopeHash=row.envelope_hash,
            replayable=bool(row.replayable) and not corrupted,
            replayableReason=REASON_RECORD_CORRUPTED if corrupted else row.replayable_reason,
        ),
        envelope=row.envelope,
        routerDecision=row.router_decision,
        events=[ExecutionEvent(seq=s.seq, type=s.type, payload=s.payload) for s in steps],
        finalResponse=row.final_response,
        status=row.status,
        intent=row.intent,
        parentExecutionId=row.parent_execution_id,
        forkedAtSeq=row.forked_at_seq,
        meta=row.meta,
    )


def read_record(engine: Engine, execution_id: str) -> ExecutionRecord:
    """The whole record of one execution; ExecutionNotFoundError if there is none."""
    return record_from_rows(*read_sql.load(engine, execution_id))


# What `RecordReader` reads of `traces` and of `trace_steps` (tracedb.projection.schema names them all).
RECORD_COLUMNS = (
    "execution_id", "created_at_ns", "envelope_hash", "replayable", "replayable_reason", "envelope",
    "router_decision", "final_response", "status", "intent", "parent_execution_id", "forked_at_seq", "meta",
    "router_decision_crc", "final_response_crc", "meta_crc",
)
RECORD_STEP_COLUMNS = ("seq", "type", "payload", "payload_crc")
# Where each step column sits in a row: the loop over a record's steps reads them by index.
_RS_SEQ, _RS_TYPE, _RS_PAYLOAD, _RS_CRC = (RECORD_STEP_COLUMNS.index(n) for n in ("seq", "type", "payload", "payload_crc"))


def _checked_events(steps) -> tuple[list, bool]:
    """The events of rows of RECORD_STEP_COLUMNS (the payload as stored), decoded, and whether
    every payload still matches its checksum: one pass, the hot part of `store.get`."""
    loads, crc, of_stored = orjson.loads, crc32c, checksums.of_stored
    events = []
    intact = True
    for r in steps:
        seq, type_, p, stored_crc = r[_RS_SEQ], r[_RS_TYPE], r[_RS_PAYLOAD], r[_RS_CRC]
        if p.__class__ is str:  # JSON text: checked as stored, then decoded
            text = p.encode()
            if crc(text) != stored_crc:
                intact = False
            p = loads(text)
        elif of_stored(p) != stored_crc:  # NULL, or a bare number SQLite kept as a number
            intact = False
        events.append(ExecutionEvent(seq, type_, p))
    return events, intact


class RecordReader:
    """Whole records by id, as fast as the driver allows; for the store's `get` and replay.

    On SQLite it reads through the sqlite3 module directly, one read-only connection per
    thread, whose statement cache keeps both queries prepared: SQLAlchemy builds and runs each
    statement anew, which cost about ten times the queries themselves. Elsewhere it reads
    through the engine. Either way the header and the steps come from one snapshot.
    """

    _TRACE_SQL = f"SELECT {', '.join(RECORD_COLUMNS)} FROM traces WHERE execution_id = ?"
    _STEPS_SQL = f"SELECT {', '.join(RECORD_STEP_COLUMNS)} FROM trace_steps WHERE execution_id = ? ORDER BY seq"

    def __init__(self, engine: Engine, *, busy_timeout_ms: int = 5000):
        self._engine = engine
        self._path = engine.url.database if engine.dialect.name == "sqlite" else None
        self._timeout_s = busy_timeout_ms / 1000.0
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def read(self, execution_id: str) -> ExecutionRecord:
        """The whole record of one execution; ExecutionNotFoundError if there is none."""
        if self._path is None:
            return read_record(self._engine, execution_id)
        if self._closed:
            raise StoreClosedError()
        conn = getattr(self._local, "conn", None) or self._connect()
        conn.execute("BEGIN")
        try:
            row = conn.execute(self._TRACE_SQL, (execution_id,)).fetchone()
            steps = conn.execute(self._STEPS_SQL, (execution_id,)).fetchall() if row is not None else ()
        finally:
            conn.execute("COMMIT")
        if row is None:
            raise ExecutionNotFoundError(execution_id)
        r = dict(zip(RECORD_COLUMNS, row))
        value = sqlite_reads.json_value
        of_stored = checksums.of_stored
        decision, final, meta = r["router_decision"], r["final_response"], r["meta"]
        events, intact = _checked_events(steps)
        corrupted = (
            not intact
            or of_stored(decision) != r["router_decision_crc"] or of_stored(final) != r["final_response_crc"]
            or of_stored(meta) != r["meta_crc"]
        )
        return ExecutionRecord(
            header=ExecutionHeader(
                executionId=r["execution_id"], createdUtcIso=utc_iso(r["created_at_ns"]),
                envelopeHash=r["envelope_hash"], replayable=bool(r["replayable"]) and not corrupted,
                replayableReason=REASON_RECORD_CORRUPTED if corrupted else r["replayable_reason"],
            ),
            envelope=value(r["envelope"]),
            routerDecision=value(decision),
            events=events,
            finalResponse=value(final),
            status=r["status"],
            intent=r["intent"],
            parentExecutionId=r["parent_execution_id"],
            forkedAtSeq=r["forked_at_seq"],
            meta=value(meta),
        )

    def _connect(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise StoreClosedError()
            conn = sqlite_reads.open_read(self._path, timeout_s=self._timeout_s, cached_statements=16)
            self._opened.append(conn)
        self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every connection it opened, in whichever thread."""
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()


def trace_status(engine: Engine, execution_id: str) -> Optional[str]:
    """The stored status of an execution, None if the database has no such execution."""
    return read_sql.trace_status(engine, execution_id)


def trace_status_and_last_seq(engine: Engine, execution_id: str) -> Optional[tuple[str, int]]:
    """The stored status and last seq of an execution, None if the database has no such execution."""
    return read_sql.trace_status_and_last_seq(engine, execution_id)


@dataclass(frozen=True)
class Filter:
    """Which executions a listing holds: every field given must match.

    `status`; creation time in [`since`, `until`) (aware datetimes or seconds since the epoch);
    `intent`, exactly; `search`, a substring of the intent in any case (no wildcards);
    `replayable`, True or False. What it came to (`tracedb.records.outcomes`): `outcome` (succeeded,
    failed, incomplete, running); `model`, one of the models it called; `error`, the code of its
    first error; `min_cost`, a cost in USD at least this (a cost unknown never matches);
    `slower_than`, seconds from creation to its last event more than this (a running execution
    never matches).
    """

    status: Optional[str] = None
    since: TimeArg = None
    until: TimeArg = None
    intent: Optional[str] = None
    search: Optional[str] = None
    replayable: Optional[bool] = None
    outcome: Optional[str] = None
    model: Optional[str] = None
    error: Optional[str] = None
    min_cost: Optional[float] = None
    slower_than: Optional[float] = None

    def outcome_args(self) -> dict:
        """The outcome filters, checked: {outcome, model_json, error, min_cost, slower_than_ns}."""
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise InvalidInputError(f"unknown outcome {self.outcome!r}", hint="one of " + ", ".join(OUTCOMES))
        for name in ("min_cost", "slower_than"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v):
                raise InvalidInputError(f"{name} must be a number at least 0, not {v!r}")
        return {
            "outcome": self.outcome,
            # The models column is a JSON list: a name is found as its JSON string in the text.
            "model_json": None if self.model is None else orjson.dumps(str(self.model)).decode(),
            "error": self.error,
            "min_cost": None if self.min_cost is None else float(self.min_cost),
            "slower_than_ns": None if self.slower_than is None else int(self.slower_than * 1e9),
        }

    def checked(self) -> dict:
        """The filters, checked, as the arguments `read_sql.filtered` and
        `sqlite_reads.page_rows` take: InvalidInputError for one no execution can match."""
        o = self.outcome_args()
        if self.replayable is not None and not isinstance(self.replayable, bool):
            raise InvalidInputError(f"replayable must be True or False, not {self.replayable!r}")
        if self.status is not None and self.status not in STATUSES:
            raise InvalidInputError(f"unknown status {self.status!r}", hint="one of " + ", ".join(STATUSES))
        since_ns, until_ns = to_ns(self.since, "since"), to_ns(self.until, "until")
        return {
            "status": self.status, "since_ns": since_ns, "until_ns": until_ns, "intent": self.intent,
            "search": _checked_search(self.search), "replayable": self.replayable, **o,
        }

    def apply(self, q):
        """`q`, a select from traces, restricted to the executions that match."""
        return read_sql.filtered(q, **self.checked())


EVERYTHING = Filter()


def list_traces(
    engine: Engine,
    *,
    status: Optional[str] = None,
    since: TimeArg = None,
    until: TimeArg = None,
    limit: Optional[int] = None,
) -> list[TraceSummary]:
    """Executions by creation time (oldest first), filtered by status and a creation-time window."""
    args = Filter(status, since, until).checked()
    if limit is not None and limit < 0:
        raise InvalidInputError("limit must not be negative")
    return [TraceSummary.from_row(r) for r in read_sql.oldest_first_rows(engine, args, limit)]


def missing_from(seqs: list[int]) -> list[int]:
    """The seqs below the last of `seqs` (an execution's events') that are not among them."""
    have = set(seqs)
    last = max(have, default=0)
    return [seq for seq in range(1, last + 1) if seq not in have] if len(have) != last else []


def missing_seqs(record: ExecutionRecord) -> list[int]:
    """The seqs below the last one that the record has no event for (events lost to damage)."""
    return missing_from([e.seq for e in record.events])


def unsound(envelope, envelope_hash: Optional[str], meta, seqs: list[int], final_response) -> bool:
    """The rules `verify` applies to a record's values (`value_problems`), with events missing
    below the last one: what `judged` and a listing's verdicts (`_reads_corrupted`) both apply."""
    return bool(value_problems(envelope, envelope_hash, meta, seqs, final_response) or missing_from(seqs))


def judged(record: ExecutionRecord) -> ExecutionRecord:
    """The record as `verify` judges it: an envelope that no longer hashes to the recorded hash,
    events missing below the last one or another of `value_problems` make it not replayable,
    `record_corrupted`."""
    header = record.header
    if unsound(record.envelope, header.envelopeHash, record.meta, [e.seq for e in record.events],
               record.finalResponse):
        record.header = dataclasses.replace(header, replayable=False, replayableReason=REASON_RECORD_CORRUPTED)
    return record


def inspect_view(record: ExecutionRecord) -> dict:
    """The `inspect ID` JSON: the payload of the last event is folded into `last_event`;
    `missing_seqs` and `problems` are added when the record is damaged."""
    last = record.last_event
    last_event = None
    if last is not None:
        last_event = {"seq": last.seq, "type": last.type}
        if isinstance(last.payload, dict):
            for k, v in last.payload.items():
                last_event.setdefault(k, v)
        elif last.payload is not None:
            last_event["payload"] = last.payload
    view = {
        "execution_id": record.execution_id,
        "status": record.status,
        "last_event": last_event,
        "replayable": record.header.replayable,
        "replayable_reason": record.header.replayableReason,
    }
    missing = missing_seqs(record)
    if missing:
        view["missing_seqs"] = missing
    problems = record_problems(record)
    if problems:
        view["problems"] = problems
    return view


# -- pages of executions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """Executions newest first; `next_cursor` continues after the last one (None: no more)."""

    items: tuple[TraceSummary, ...]
    next_cursor: Optional[str]


@dataclass(frozen=True)
class EventTime:
    """When an event was recorded, and the time since the one before (the first: since the start)."""

    seq: int
    recorded_at_ns: int
    since_previous_ns: int

    def to_dict(self) -> dict:
        return {
            "seq": self.seq,
            "recordedUtcIso": utc_iso(self.recorded_at_ns),
            "sincePreviousMs": round(self.since_previous_ns / 1e6, 3),
        }


@dataclass(frozen=True)
class Timeline:
    """An execution's record and when each of its events was recorded; with the row's creation
    and last-change times, its pin and its status note (why it was invalidated or marked)."""

    record: ExecutionRecord
    event_times: tuple[EventTime, ...]
    created_at_ns: int = 0
    updated_at_ns: int = 0
    pinned: bool = False
    status_note: Optional[str] = None
    # What it came to and cost, from its row (`rows.outcome_view`).
    outcome: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Lineage:
    """Where an execution was forked from, and the forks made from it.

    `ancestors`: (parent id, the seq its child was forked at), the nearest parent first.
    `forks`: (fork id, the seq it was forked at), oldest first.
    """

    execution_id: str
    ancestors: tuple[tuple[str, int], ...]
    forks: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict:
        def side(pairs):
            return [{"execution_id": eid, "forked_at_seq": seq} for eid, seq in pairs]

        return {"execution_id": self.execution_id, "ancestors": side(self.ancestors), "forks": side(self.forks)}


def _resolved(prefix: str, found: list, pending: Optional[Pending] = None) -> str:
    """The one id of the database's `found` (ids that start with `prefix`, the exact one not
    among them) and `pending`'s executions."""
    if pending:
        if prefix in pending.rows:
            return prefix
        found = sorted({*found, *(e for e in pending.rows if prefix and e.startswith(prefix))})
    if not found:
        raise ExecutionNotFoundError(prefix)
    if len(found) > 1:
        raise AmbiguousExecutionIdError(prefix, found[:AMBIGUOUS_SHOWN], len(found) > AMBIGUOUS_SHOWN)
    return found[0]


def _with_kind(prefix: str) -> list[str]:
    """`prefix` with the kind each generated id starts with (`exec-`, `otel-`) in front, when it
    has none: what a prefix that matched nothing may have meant."""
    kinds = (PREFIX, OTEL_PREFIX)
    if not prefix or prefix.startswith(kinds):
        return []
    return [kind + prefix for kind in kinds]


def _not_found(prefix: str, matches: list[str]) -> ExecutionNotFoundError:
    """The error for `prefix`, which matched nothing; `matches`: the `_with_kind` prefixes that
    match (a prefix is matched from the start of the id, kind included: a guess at the kind
    could pick the wrong execution)."""
    if not matches:
        return ExecutionNotFoundError(prefix)
    return ExecutionNotFoundError(
        prefix,
        hint=f"ids start with their kind: did you mean {' or '.join(repr(m) for m in matches)}? "
        "(a prefix matches from the start of the id)",
    )


def _page_stmt(where: Filter, before: Optional[str], n: int, pending: Pending):
    """Up to `n` listed rows of the database that match `where`, newest first, after `before`,
    none of `pending`'s."""
    args = where.checked()
    return read_sql.page_stmt(args, None if before is None else position(before), n, _leave_out(pending))


def _leave_out(pending: Pending) -> list:
    """The executions `pending` shows as they are now: a read of the database leaves them out."""
    return list(pending.rows) if pending else []


def _mapping(row):
    # A row of the engine, or a dict from tracedb.reads.sqlite.
    return row if isinstance(row, dict) else row._mapping


def _page_from(items: list, limit: int) -> Page:
    """The page of the first `limit` of `items`; one more than `limit` says another page follows."""
    shown = tuple(items[:limit])
    return Page(shown, shown[-1].cursor if len(items) > limit and shown else None)


def _as_judged(item: TraceSummary, corrupted: bool) -> TraceSummary:
    """`item` as its `judged` record reads: not replayable, `record_corrupted`, when the record
    reads `corrupted`; otherwise as stored (its record, read a moment later, may be newer)."""
    if not corrupted or item.replayable_reason == REASON_RECORD_CORRUPTED:
        return item
    return dataclasses.replace(item, replayable=False, replayable_reason=REASON_RECORD_CORRUPTED)


def _reads_corrupted(j: sqlite_reads.Judged) -> bool:
    """Whether the record `judged(record_from_rows(...))` makes of what `j` read reads
    `record_corrupted`: a value or payload that fails its checksum (`record_from_rows`), a
    value that fails `unsound`'s rules, or the reason stored so."""
    return (
        bool(j.damaged_columns) or not j.steps_intact
        or unsound(j.envelope, j.envelope_hash, j.meta, j.seqs, j.final_response)
        or j.replayable_reason == REASON_RECORD_CORRUPTED
    )


def _kept(items: list, where: Filter) -> list:
    """`items`, judged, without those `where.replayable` rules out: the database filters on the
    stored flag, and a record that fails verification is no longer replayable."""
    return [i for i in items if i.replayable] if where.replayable else items


def _timeline(row, steps) -> Timeline:
    times = []
    previous = row.created_at_ns
    for s in steps:
        times.append(EventTime(s.seq, s.recorded_at_ns, max(0, s.recorded_at_ns - previous)))
        previous = s.recorded_at_ns
    return Timeline(
        record_from_rows(row, steps), tuple(times), row.created_at_ns, row.updated_at_ns, bool(row.pinned),
        row.status_note, outcome_view(vars(row)),
    )


@dataclass(frozen=True)
class TimedEvent:
    """One recorded event with the time it was recorded."""

    seq: int
    type: str
    payload: object
    recorded_at_ns: int

    @property
    def error(self) -> Optional[dict]:
        """{code, message} of the error this event records, else None (`tracedb.records.outcomes`)."""
        return event_error(self.type, self.payload)


@dataclass(frozen=True)
class Progress:
    """An execution's state now and the events recorded after a given seq (what a live view
    polls for): status and replayability from the same snapshot as the events."""

    execution_id: str
    status: str
    replayable: bool
    replayable_reason: Optional[str]
    last_seq: int
    events: tuple[TimedEvent, ...]


def _count_stmt(where: Filter, pending: Pending):
    """How many executions of the database match `where`, leaving out `pending`'s."""
    return read_sql.count_stmt(where.checked(), _leave_out(pending))


def _pending_count(pending: Pending, where: Filter) -> int:
    return sum(1 for row in pending.rows.values() if _pending_matches(row, where))


def _status_counts_stmt(where: Filter, pending: Pending):
    # Counts for every status under the other filters: a listing shows them side by side.
    others = dataclasses.replace(where, status=None)
    return read_sql.status_counts_stmt(others.checked(), _leave_out(pending))


def _plus_pending(counts: dict, pending: Pending, where: Filter, at_most: Optional[int]) -> dict:
    """`counts` per status (of the database, `pending`'s left out) with `pending`'s executions
    that match `where`'s other filters; each at most `at_most` + 1 when given."""
    others = dataclasses.replace(where, status=None)
    for row in pending.rows.values():
        if _pending_matches(row, others):
            counts[row["status"]] += 1
    return counts if at_most is None else {s: min(n, at_most + 1) for s, n in counts.items()}


def _bounded_count_stmts(where: Filter, at_most: int, pending: Pending):
    """(status, a count of its matches that stops at `at_most` + 1), one per status: each walks
    the (status, created_at_ns, execution_id) index and stops early, so its cost does not grow
    with the store."""
    if at_most < 0:
        raise InvalidInputError("at_most must not be negative")
    out = []
    for status in STATUSES:
        one = Filter(status, where.since, where.until, where.intent, where.search, where.replayable)
        out.append((status, read_sql.bounded_count_stmt(one.checked(), at_most, _leave_out(pending))))
    return out


def _status_counts(rows) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for status, n in rows:
        counts[status] = int(n)
    return counts


def _progress_stmts(execution_id: str, after_seq: int, limit: int):
    if after_seq < 0 or limit < 1:
        raise InvalidInputError("after_seq must not be negative and limit must be positive")
    return read_sql.progress_stmts(execution_id, after_seq, limit)


def _progress(execution_id: str, head, steps, pending: Pending, after_seq: int, limit: int) -> Progress:
    """The Progress of the database's `head` row and `steps`, or of `pending`'s row and steps."""
    row = pending.rows.get(execution_id)
    if row is not None:
        head = SimpleNamespace(**row)
        stored = () if execution_id in pending.replaced else steps  # an earlier execution's
        steps = [*stored, *(s for s in pending.steps.get(execution_id, ()) if s.seq > after_seq)][:limit]
    if head is None:
        raise ExecutionNotFoundError(execution_id)
    return Progress(
        execution_id, head.status, bool(head.replayable), head.replayable_reason, head.last_seq,
        tuple(TimedEvent(s.seq, s.type, s.payload, s.recorded_at_ns) for s in steps),
    )


def _event(execution_id: str, seq: int, stored, pending: Pending) -> TimedEvent:
    """The database's `stored` step, or the one `pending` read from the WAL (the only one when the
    database's belongs to an earlier execution of the id, `pending.replaced`)."""
    if execution_id in pending.replaced:
        stored = None
    s = stored or next((p for p in pending.steps.get(execution_id, ()) if p.seq == seq), None)
    if s is None:
        raise ExecutionNotFoundError(f"{execution_id} seq {seq}")
    return TimedEvent(s.seq, s.type, s.payload, s.recorded_at_ns)


def _pending_matches(row: dict, where: Filter) -> bool:
    """`where`, in Python, for a row as `pending` shows it (the SQL of `Filter.apply`)."""
    if where.status is not None and row["status"] != where.status:
        return False
    replayable = getattr(where, "replayable", None)
    if replayable is not None and bool(row["replayable"]) != replayable:
        return False
    since, until = to_ns(where.since, "since"), to_ns(where.until, "until")
    if since is not None and row["created_at_ns"] < since:
        return False
    if until is not None and row["created_at_ns"] >= until:
        return False
    if where.intent is not None and row["intent"] != where.intent:
        return False
    if where.search and where.search.lower() not in (row["intent"] or "").lower():
        return False
    return _outcome_matches(row, where.outcome_args())


def _outcome_matches(row: dict, o: dict) -> bool:
    """The outcome filters of `Filter.apply`, in Python, for a row as `pending` shows it."""
    if o["outcome"] is not None and row.get("outcome") != o["outcome"]:
        return False
    if o["model_json"] is not None and orjson.loads(o["model_json"]) not in (row.get("models") or ()):
        return False
    if o["error"] is not None and row.get("error_code") != o["error"]:
        return False
    if o["min_cost"] is not None and (row.get("cost_usd") is None or row["cost_usd"] < o["min_cost"]):
        return False
    if o["slower_than_ns"] is not None:
        end = row.get("last_event_ns")
        if row.get("outcome") == "running" or end is None or end - row["created_at_ns"] <= o["slower_than_ns"]:
            return False
    return True


def _merged(rows: list, pending: Pending, where: Filter, before: Optional[str], n: int) -> list:
    """The newest `n` of the database's `rows` (up to `n` of them, none of `pending`'s) and
    `pending`'s matching executions, as summaries."""
    items = [TraceSummary.from_row(_mapping(r)) for r in rows]
    if not pending:
        return items
    cut = position(before) if before is not None else None
    # Only the newest n of the pending rows can be on the page: make those alone.
    keys = sorted(
        ((row["created_at_ns"], eid) for eid, row in pending.rows.items()
         if _pending_matches(row, where) and (cut is None or (row["created_at_ns"], eid) < cut)),
        reverse=True,
    )[:n]
    for _created, eid in keys:
        items.append(TraceSummary.from_row({**pending.rows[eid], "last_event_at_ns": pending.last_event_at_ns.get(eid)}))
    items.sort(key=lambda s: (s.created_at_ns, s.execution_id), reverse=True)
    return items[:n]


def _checked_limit(limit: int) -> int:
    if limit < 0:
        raise InvalidInputError("limit must not be negative")
    return limit


class Reader:
    """Reads of one store's database, without the WAL lock: a recorder may run meanwhile.

    A context manager; `Reader.open(config)` owns its engine and disposes of it on close.
    Every method that takes an execution id takes a unique prefix of one too.

    Opened on a SQLite file whose schema is current, it finds executions, reads pages, records
    and the WAL's pending view through the sqlite3 module (`tracedb.reads.sqlite`), and makes
    its SQLAlchemy engine only when another read needs it.
    """

    def __init__(self, engine: Optional[Engine], *, owns_engine: bool = False, config: Optional[Config] = None,
                 connection: Optional[sqlite3.Connection] = None):
        """With `config` (what `open` passes), reads also show what the data directory's WAL
        holds beyond the database when no recorder runs (see `tracedb.reads.wal_tail`). With
        `connection` (a `tracedb.reads.sqlite.connect` of the file `config` names), `engine` may
        be None: it is made from `config` when first needed."""
        if engine is None and (connection is None or config is None):
            raise InvalidInputError("a Reader needs an engine, or a connection and a config")
        self._engine = engine
        self._owns_engine = owns_engine
        self._config = config
        self._lite = connection
        self._lite_lock = threading.Lock()  # one sqlite3 connection: one read on it at a time
        self._pending: Optional[Pending] = None

    @classmethod
    def open(cls, config: Config) -> "Reader":
        """A reader of the store `config` names; StoreNotFoundError (exit 3) if there is none."""
        if "://" not in config.database and path_exists(config.database, config.data_dir):  # a SQLite file
            conn = sqlite_reads.connect(config.database, busy_timeout_ms=config.busy_timeout_ms)
            if conn is not None:
                return cls(None, owns_engine=True, config=config, connection=conn)
        engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms)
        return cls(engine, owns_engine=True, config=config)

    @contextlib.contextmanager
    def _reading_lite(self):
        """The sqlite3 connection's lock, held for one read; SQLite's error of a file it could
        not read (its -wal or -shm refused, a disk that fails) raised as the one naming it."""
        with self._lite_lock:
            try:
                yield
            except sqlite3.Error as e:
                err = sqlite_reads.access_error(self._config.database, e, self._config.data_dir)
                if err is None:
                    raise
                raise err from None

    @property
    def pending(self) -> Pending:
        """What the WAL holds beyond the database, read once (empty while a recorder runs)."""
        if self._pending is None:
            self._pending = self._pending_now()
        return self._pending

    def _pending_now(self) -> Pending:
        """What the WAL holds beyond the database now."""
        if self._config is None:
            return Pending()
        if self._lite is not None:
            with self._reading_lite():
                return load_pending(self._config, self._lite)
        return load_pending(self._config, self.engine)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = db.open_store_engine(self._config.database, busy_timeout_ms=self._config.busy_timeout_ms)
        return self._engine

    def close(self) -> None:
        if self._lite is not None:
            with self._lite_lock:
                self._lite.close()
        if self._owns_engine and self._engine is not None:
            self._engine.dispose()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def resolve(self, prefix: str) -> str:
        """The execution id that is `prefix` or starts with it, as git takes short hashes.

        An exact id wins even when it is also the prefix of others. ExecutionNotFoundError (exit 3)
        when nothing matches, AmbiguousExecutionIdError (exit 2) when several do.
        """
        if self._lite is not None:
            with self._reading_lite():
                if sqlite_reads.exists(self._lite, prefix):
                    return prefix
                found = sqlite_reads.ids_with_prefix(self._lite, prefix, AMBIGUOUS_SHOWN + 1)
        else:
            exact, candidates = read_sql.resolve_stmts(self.engine.dialect.name, prefix, AMBIGUOUS_SHOWN + 1)
            with self.engine.connect() as conn:
                if conn.execute(exact).first() is not None:
                    return prefix
                found = conn.execute(candidates).scalars().all()
        try:
            return _resolved(prefix, found, self.pending)
        except ExecutionNotFoundError:
            matches = []
            for candidate in _with_kind(prefix):
                try:
                    self.resolve(candidate)
                except ExecutionNotFoundError:
                    continue
                except AmbiguousExecutionIdError:
                    pass
                matches.append(candidate)
            raise _not_found(prefix, matches) from None

    def page(
        self, where: Filter = EVERYTHING, *, before: Optional[str] = None, limit: int = DEFAULT_PAGE_SIZE,
        judge: bool = True,
    ) -> Page:
        """Up to `limit` executions that match `where`, newest first, older than the cursor
        `before` if given.

        The filters run in SQL. The position is a keyset (created_at_ns, execution_id), served by
        an index ending in those columns, so a page costs the same however deep it is.

        Each row is judged as `get` judges its record (`judged`): the page's rows together,
        from two queries that check the payloads against their checksums without decoding them
        (`sqlite_reads.judged_rows`, the rules of `unsound`; `read_sql.judged_rows` through an
        engine); a row the WAL holds beyond the database, from its record. A row that fails verification reads not replayable,
        `record_corrupted`, and `Filter(replayable=True)` leaves it out, and reads on to fill
        the page (up to REFILLS reads: past that, the page is short and `next_cursor`
        continues after the rows read).
        `judge=False` gives the stored flags without reading the records (for a caller that
        reads each record anyway).
        """
        _checked_limit(limit)
        kept, cut = [], before
        for _ in range(REFILLS):
            n = limit + 1 - len(kept)  # one more than the page tells whether another follows
            rows = self._rows(where, cut, n)
            kept += _kept(self._judged_rows(rows), where) if judge else rows
            if len(kept) > limit or len(rows) < n:
                return _page_from(kept, limit)
            cut = rows[-1].cursor
        return Page(tuple(kept), cut)

    def _rows(self, where: Filter, before: Optional[str], n: int) -> list:
        """Up to `n` summaries that match `where`, newest first, after `before`, as stored (or
        as the WAL shows them)."""
        pending = self.pending
        if self._lite is not None:
            args = where.checked()
            cut = None if before is None else position(before)
            with self._reading_lite():
                rows = sqlite_reads.page_rows(self._lite, **args, before=cut, limit=n, leave_out=tuple(pending.rows))
        else:
            with self.engine.connect() as conn:
                rows = conn.execute(_page_stmt(where, before, n, pending)).all()
        return _merged(rows, pending, where, before, n)

    def _judged_rows(self, items: list, pending: Optional[Pending] = None) -> list:
        """`items` as `get` judges their records (`_as_judged`). The rows the database holds
        are judged together, from two queries that decode no event (`sqlite_reads.judged_rows`,
        `read_sql.judged_rows` through an engine); the WAL's rows record by record."""
        pending = self.pending if pending is None else pending
        ids = [i.execution_id for i in items if i.execution_id not in pending.rows]
        if not ids:
            read: dict = {}
        elif self._lite is not None:
            with self._reading_lite():
                read = sqlite_reads.judged_rows(self._lite, ids)
        else:
            read = read_sql.judged_rows(self.engine, ids)
        return [self._judged_row(item, read.get(item.execution_id), pending) for item in items]

    def _judged_row(self, item: TraceSummary, read: Optional[sqlite_reads.Judged], pending: Pending) -> TraceSummary:
        """`item` judged from what `judged_rows` `read` of it, else from its whole record."""
        if read is not None:
            return _as_judged(item, _reads_corrupted(read))
        try:
            record = self._record_now(item.execution_id, pending)
        except ExecutionNotFoundError:
            return item  # pruned since the page was read
        return _as_judged(item, record.header.replayableReason == REASON_RECORD_CORRUPTED)

    def count(self, where: Filter = EVERYTHING) -> int:
        """How many executions match `where`."""
        pending = self.pending
        with self.engine.connect() as conn:
            n = int(conn.execute(_count_stmt(where, pending)).scalar() or 0)
        return n + _pending_count(pending, where)

    def status_counts(self, where: Filter = EVERYTHING, *, at_most: Optional[int] = None) -> dict[str, int]:
        """How many executions of each status match `where`'s other filters (its status is
        left out, so that a listing can show every status side by side).

        With `at_most`, counting a status stops past it (a count of `at_most` + 1 means "more"):
        an exact count reads every matching row, which on millions takes seconds."""
        pending = self.pending
        with self.engine.connect() as conn, conn.begin():
            if at_most is None:
                counts = _status_counts(conn.execute(_status_counts_stmt(where, pending)).all())
            else:
                counts = {s: int(conn.execute(q).scalar() or 0) for s, q in _bounded_count_stmts(where, at_most, pending)}
        return _plus_pending(counts, pending, where, at_most)

    def progress(self, execution_id: str, after_seq: int = 0, *, limit: int = 1000) -> Progress:
        """An execution's status and up to `limit` events recorded after `after_seq` (an exact
        id: a live view asks again and again)."""
        head, steps = _progress_stmts(execution_id, after_seq, limit)
        with self.engine.connect() as conn, conn.begin():
            row = conn.execute(head).first()
            stored = conn.execute(steps).all()
        return _progress(execution_id, row, stored, self.pending, after_seq, limit)

    def event(self, execution_id: str, seq: int) -> TimedEvent:
        """One event of an execution (an exact id); ExecutionNotFoundError if there is none."""
        with self.engine.connect() as conn:
            s = conn.execute(read_sql.event_stmt(execution_id, seq)).first()
        return _event(execution_id, seq, s, self.pending)

    def each(
        self, where: Filter = EVERYTHING, *, before: Optional[str] = None, page_size: int = STREAM_PAGE_SIZE,
        judge: bool = True,
    ) -> Iterator[TraceSummary]:
        """Every execution that matches `where` (older than `before` if given), newest first.

        One page in memory at a time, each read in its own short transaction: a long listing
        neither grows with the store nor holds a snapshot that keeps SQLite's WAL from shrinking.
        """
        while True:
            page = self.page(where, before=before, limit=page_size, judge=judge)
            yield from page.items
            if page.next_cursor is None:
                return
            before = page.next_cursor

    def get(self, execution_id: str) -> ExecutionRecord:
        """The whole record of one execution, judged as `verify` judges it: a record whose
        envelope no longer hashes to its envelope hash, or whose events have gaps, reads as not
        replayable, `record_corrupted`."""
        return self._record_now(self.resolve(execution_id))

    def _record_now(self, execution_id: str, pending: Optional[Pending] = None) -> ExecutionRecord:
        """The judged record of an exact id, with what the WAL holds beyond the database."""
        return judged(record_from_rows(*self._load_now(execution_id, pending)))

    def _load_now(self, execution_id: str, pending: Optional[Pending] = None):
        """`read_sql.load`, with what the WAL holds beyond the database folded in (`pending`, else
        `self.pending`)."""
        pending = self.pending if pending is None else pending
        row = pending.rows.get(execution_id)
        if row is not None and execution_id in pending.replaced:
            # The database holds an earlier execution of this id, which a start in the WAL replaced.
            return SimpleNamespace(**row), list(pending.steps.get(execution_id, ()))
        if self._lite is not None:
            with self._reading_lite():
                stored, steps = sqlite_reads.load(self._lite, execution_id, trace=row is None)
            if row is None:
                if stored is None:
                    raise ExecutionNotFoundError(execution_id)
                return SimpleNamespace(**stored), steps
        elif row is None:
            return read_sql.load(self.engine, execution_id)
        else:
            with self.engine.connect() as conn:
                steps = read_sql.checked_steps(conn, execution_id)
        return SimpleNamespace(**row), [*steps, *pending.steps.get(execution_id, ())]

    def timeline(self, execution_id: str) -> Timeline:
        """The record and each event's recorded time, read from one snapshot."""
        return self._timeline_now(self.resolve(execution_id))

    def _timeline_now(self, execution_id: str, pending: Optional[Pending] = None) -> Timeline:
        t = _timeline(*self._load_now(execution_id, pending))
        return dataclasses.replace(t, record=judged(t.record))

    def inspect(self, execution_id: str) -> dict:
        """The `inspect ID` view: status, the last event, replayability; `missing_seqs`,
        `damaged_seqs` and `damaged_columns` (values that no longer match their checksums),
        `problems` when the record is damaged; `note`, the status note (the reason an operator
        gave to invalidate it, a recording failure's detail, what a salvage recorded as lost);
        `lost_records` ({count, first, last}) when a client that failed open flagged it
        recording_failure with what it lost."""
        row, steps = self._load_now(self.resolve(execution_id))
        record = judged(record_from_rows(row, steps))
        view = inspect_view(record)
        seqs, columns = damage(row, steps)
        if seqs:
            view["damaged_seqs"] = seqs
        if columns:
            view["damaged_columns"] = columns
        note = getattr(row, "status_note", None)
        if note and view["replayable_reason"] != REASON_EXECUTION_INCOMPLETE:
            # Why: the reason given to invalidate, a recording failure, what a salvage lost. (An
            # incomplete execution's view keeps exactly the five keys scripts read from it.)
            view["note"] = note
        lost = lost_records(note) if view["replayable_reason"] == REASON_RECORDING_FAILURE else None
        if lost is not None:
            view["lost_records"] = lost.to_dict()
        view.update(outcome_view(vars(row)))
        view["errored_events"] = errored_events(record.events)
        return view

    def stats(self, since_ns: Optional[int] = None, by: Optional[str] = None) -> dict:
        """Counts, failure rate, duration percentiles, tokens and cost of the executions created
        at or after `since_ns`, in SQL, overall and grouped `by` intent, model, outcome, day or
        hour (`tracedb.reads.stats`, whose doc gives the answer's shape)."""
        return read_stats(self.engine, since_ns, by)

    def lost_records(self, execution_ids: Sequence[str]) -> dict[str, LostRecords]:
        """{id: what a client that failed open lost of it} for those of `execution_ids` flagged
        recording_failure with such a note (`record.lost_records`); exact ids."""
        pending = self.pending
        notes = {eid: pending.rows[eid].get("status_note") for eid in execution_ids if eid in pending.rows}
        rest = [eid for eid in execution_ids if eid not in pending.rows]
        if rest and self._lite is not None:
            with self._reading_lite():
                notes.update(sqlite_reads.status_notes(self._lite, rest))
        elif rest:
            notes.update(read_sql.status_notes(self.engine, rest))
        found = {eid: lost_records(note) for eid, note in notes.items()}
        return {eid: lost for eid, lost in found.items() if lost is not None}

    def replay(self, execution_id: str, *, envelope: Optional[dict] = None, force: bool = False) -> ReplayResult:
        """Exact replay of a recorded execution: its final response, no agent called."""
        return ReplayEngine(self.get(execution_id)).replay(env=envelope, force=force)

    def diff(self, a: str, b: str) -> TraceDiff:
        """Two executions side by side up to their first divergent step."""
        return diff_traces(self.get(a), self.get(b))

    def lineage(self, execution_id: str) -> Lineage:
        """The chain of parents an execution was forked from, and the forks made from it."""
        eid = self.resolve(execution_id)
        ancestors: list[tuple[str, int]] = []
        with self.engine.connect() as conn, conn.begin():
            current, seen = eid, {eid}
            while True:
                row = conn.execute(read_sql.parent_stmt(current)).first()
                if row is None or row.parent_execution_id is None or row.parent_execution_id in seen:
                    break
                ancestors.append((row.parent_execution_id, row.forked_at_seq))
                current = row.parent_execution_id
                seen.add(current)
            forks = conn.execute(read_sql.forks_stmt(eid)).all()
        return Lineage(eid, tuple(ancestors), tuple((r.execution_id, r.forked_at_seq) for r in forks))

    def verify(self, execution_id: Optional[str] = None) -> VerifyResult:
        """Verify one execution, or all of them and the database itself."""
        return verifying.verify(self.engine, None if execution_id is None else self.resolve(execution_id))


class AsyncReader:
    """`Reader` for an event loop: the same queries, awaited, on an asyncio engine (aiosqlite for
    SQLite, psycopg's async mode for PostgreSQL), so the loop never blocks on the database.

    Opened from a `Config`, it shows what `Reader` shows: when no recorder runs, what the WAL
    holds beyond the database (`tracedb.reads.wal_tail`), looked at again for each read (in a worker
    thread: reading the WAL blocks), and records judged as `verify` judges them.

    `reader = await AsyncReader.open(config)`, then `await reader.page(...)`; `await
    reader.close()` (or `async with`).
    """

    def __init__(self, engine: "AsyncEngine", config: Config):
        self._engine = engine
        self._config = config
        self._sync: Optional[Reader] = None  # whole records and the pending view, in worker threads
        self._sync_lock = threading.Lock()

    @classmethod
    async def open(cls, config: Config) -> "AsyncReader":
        """A reader of the store `config` names; StoreNotFoundError (exit 3) if there is none."""
        # Checking the schema is blocking work, done once, off the loop.
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms).dispose()
        )
        return cls(db.create_async_read_engine(config.database, busy_timeout_ms=config.busy_timeout_ms), config)

    async def close(self) -> None:
        with self._sync_lock:
            sync, self._sync = self._sync, None
        if sync is not None:
            sync.close()
        await self._engine.dispose()

    async def __aenter__(self) -> "AsyncReader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _reader(self) -> Reader:
        """The blocking `Reader` of the same store (made on first use, in a worker thread)."""
        with self._sync_lock:
            if self._sync is None:
                self._sync = Reader.open(self._config)
            return self._sync

    async def _in_thread(self, call):
        """`call(reader)` on the blocking `Reader`, in a worker thread: the loop does not wait."""
        return await asyncio.to_thread(lambda: call(self._reader()))

    async def pending(self) -> Pending:
        """What the WAL holds beyond the database now (see `Reader.pending`): empty while a
        recorder runs. Looked at again on each call, in a worker thread."""
        if not unheld_wal(self._config):
            return Pending()  # no WAL, or a recorder runs: it compacts and recovers by itself
        return await self._in_thread(lambda r: r._pending_now())

    async def resolve(self, prefix: str, pending: Optional[Pending] = None) -> str:
        """The execution id that is `prefix` or starts with it (see `Reader.resolve`)."""
        exact, candidates = read_sql.resolve_stmts(self._engine.dialect.name, prefix, AMBIGUOUS_SHOWN + 1)
        async with self._engine.connect() as conn:
            if (await conn.execute(exact)).first() is not None:
                return prefix
            found = (await conn.execute(candidates)).scalars().all()
        pending = await self.pending() if pending is None else pending
        try:
            return _resolved(prefix, found, pending)
        except ExecutionNotFoundError:
            matches = []
            for candidate in _with_kind(prefix):
                try:
                    await self.resolve(candidate, pending)
                except ExecutionNotFoundError:
                    continue
                except AmbiguousExecutionIdError:
                    pass
                matches.append(candidate)
            raise _not_found(prefix, matches) from None

    async def page(
        self, where: Filter = EVERYTHING, *, before: Optional[str] = None, limit: int = DEFAULT_PAGE_SIZE,
        judge: bool = True,
    ) -> Page:
        """Up to `limit` executions that match `where`, newest first (see `Reader.page`)."""
        _checked_limit(limit)
        pending = await self.pending()
        kept, cut = [], before
        for _ in range(REFILLS):
            n = limit + 1 - len(kept)
            async with self._engine.connect() as conn:
                rows = (await conn.execute(_page_stmt(where, cut, n, pending))).all()
            rows = _merged(rows, pending, where, cut, n)
            if judge:
                kept += _kept(await self._in_thread(lambda r: r._judged_rows(rows, pending)), where)
            else:
                kept += rows
            if len(kept) > limit or len(rows) < n:
                return _page_from(kept, limit)
            cut = rows[-1].cursor
        return Page(tuple(kept), cut)

    async def get(self, execution_id: str) -> ExecutionRecord:
        """The whole record of one execution, judged (see `Reader.get`)."""
        pending = await self.pending()
        eid = await self.resolve(execution_id, pending)
        return await self._in_thread(lambda r: r._record_now(eid, pending))

    async def timeline(self, execution_id: str) -> Timeline:
        """The record and each event's recorded time, read from one snapshot (see `Reader.timeline`)."""
        pending = await self.pending()
        eid = await self.resolve(execution_id, pending)
        return await self._in_thread(lambda r: r._timeline_now(eid, pending))

    async def count(self, where: Filter = EVERYTHING) -> int:
        """How many executions match `where`."""
        pending = await self.pending()
        async with self._engine.connect() as conn:
            n = int((await conn.execute(_count_stmt(where, pending))).scalar() or 0)
        return n + _pending_count(pending, where)

    async def status_counts(self, where: Filter = EVERYTHING, *, at_most: Optional[int] = None) -> dict[str, int]:
        """How many executions of each status match `where`'s other filters (see `Reader.status_counts`)."""
        pending = await self.pending()
        async with self._engine.connect() as conn, conn.begin():
            if at_most is None:
                counts = _status_counts((await conn.execute(_status_counts_stmt(where, pending))).all())
            else:
                counts = {s: int((await conn.execute(q)).scalar() or 0)
                          for s, q in _bounded_count_stmts(where, at_most, pending)}
        return _plus_pending(counts, pending, where, at_most)

    async def progress(self, execution_id: str, after_seq: int = 0, *, limit: int = 1000) -> Progress:
        """An execution's status and the events recorded after `after_seq` (see `Reader.progress`)."""
        head, steps = _progress_stmts(execution_id, after_seq, limit)
        pending = await self.pending()
        async with self._engine.connect() as conn, conn.begin():
            row = (await conn.execute(head)).first()
            stored = (await conn.execute(steps)).all()
        return _progress(execution_id, row, stored, pending, after_seq, limit)

    async def event(self, execution_id: str, seq: int) -> TimedEvent:
        """One event of an execution (an exact id); ExecutionNotFoundError if there is none."""
        async with self._engine.connect() as conn:
            s = (await conn.execute(read_sql.event_stmt(execution_id, seq))).first()
        return _event(execution_id, seq, s, await self.pending())

    async def diff(self, a: str, b: str) -> TraceDiff:
        """Two executions side by side up to their first divergent step (see `Reader.diff`)."""
        return diff_traces(await self.get(a), await self.get(b))

    async def stats(self, since_ns: Optional[int] = None, by: Optional[str] = None) -> dict:
        """`Reader.stats`, in a worker thread (the web view's overview)."""
        return await self._in_thread(lambda r: r.stats(since_ns, by))

    async def lineage(self, execution_id: str) -> Lineage:
        """The chain of parents an execution was forked from, and the forks made from it."""
        eid = await self.resolve(execution_id)
        ancestors: list[tuple[str, int]] = []
        async with self._engine.connect() as conn, conn.begin():
            current, seen = eid, {eid}
            while True:
                row = (await conn.execute(read_sql.parent_stmt(current))).first()
                if row is None or row.parent_execution_id is None or row.parent_execution_id in seen:
                    break
                ancestors.append((row.parent_execution_id, row.forked_at_seq))
                current = row.parent_execution_id
                seen.add(current)
            forks = (await conn.execute(read_sql.forks_stmt(eid))).all()
        return Lineage(eid, tuple(ancestors), tuple((r.execution_id, r.forked_at_seq) for r in forks))
