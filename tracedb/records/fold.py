"""WAL records into row changes: the one fold of tracedb's records into `traces` and `trace_steps`
rows, pure (no I/O).

Two consumers run it: the compactor (`tracedb.projection.compactor`), which writes what it folds, and the
read of what only the WAL holds (`tracedb.reads.wal_tail`), which shows it. They differ only in what
they know of the database:

- The compactor knows nothing of it while it folds (`held=None`): a record of an execution the
  batch did not start becomes a change of a row assumed to exist (a delta: tokens and cost are
  increments, `models` the new names, the error the batch's first), and the database answers
  for the rest when the batch is written (a row another recorder owns, a trace pruned, a start
  of an id this recorder's rows hold already).
- The pending read hands it the database's rows (`held`): records of an execution with no row
  are skipped, and rows another recorder owns (`foreign`) take only what any recorder may apply
  to them, invalidation and recording_failure, as the compactor's guarded UPDATEs do.

A second start of an execution id (met only when the WAL is applied again from below, after
`prune` deleted the first execution and the id was used again: docs/damage.md) replaces the
earlier execution, its row and its steps, unless another recorder owns the id: then the start
and the records after it that only the owner may apply are skipped.

Each record's derived columns (outcome, first error, models, tokens, cost) come from
`tracedb.records.outcomes`; lifecycle changes from `codec.transition`.
"""

from __future__ import annotations

from typing import Optional

import orjson

from wal.format import crc32c

from tracedb.records import outcomes
from tracedb.records.codec import (
    EVENT_TAG,
    OP_EVENT,
    EventFrame,
    OP_FINISH,
    OP_INCOMPLETE,
    OP_INVALIDATE,
    OP_RECORDING_FAILURE,
    OP_START,
    is_event,
    split_event,
    transition,
)
from tracedb.errors import IntegrityError
from tracedb.records.outcomes import fold_event, fold_facts, may_matter
from tracedb.records.record import FINAL_RESPONSE, ROUTER_DECISION, STATUS_RUNNING
from tracedb.projection.schema import TRACE_STEPS

# A step row's values, in this order, laid end to end in `Fold.steps`.
STEP_COLUMNS = TRACE_STEPS
STEP_WIDTH = len(STEP_COLUMNS)
# The ops whose records any recorder may apply to a row another recorder owns.
ANY_RECORDER_OPS = frozenset({OP_INVALIDATE, OP_RECORDING_FAILURE})


# What every new row starts with (`new_row` copies it and sets the start record's columns).
_NEW_ROW = {
    "execution_id": None, "recorder_id": None, "intent": None, "status": STATUS_RUNNING,
    "replayable": False, "replayable_reason": None, "status_note": None, "envelope": None,
    "envelope_hash": None, "router_decision": None, "final_response": None, "last_seq": 0,
    "created_at_ns": None, "updated_at_ns": None, "parent_execution_id": None,
    "forked_at_seq": None, "pinned": False, "meta": None, **outcomes.initial(), "last_event_ns": None,
}


def new_row(d: dict, recorder_id: str) -> dict:
    """The whole `traces` row a start record makes (JSON columns as values, not text)."""
    t = d["t"]
    row = _NEW_ROW.copy()
    row["execution_id"] = d["id"]
    row["recorder_id"] = recorder_id
    row["intent"] = d.get("intent")
    row["envelope"] = d["envelope"]
    row["envelope_hash"] = d["hash"]
    row["created_at_ns"] = row["updated_at_ns"] = t
    row["parent_execution_id"] = d.get("parent")
    row["forked_at_seq"] = d.get("fork_seq")
    row["meta"] = d.get("meta")
    row["models"] = []  # its own list: the fold appends to it
    return row


def steps_of(flat: list, width: int = STEP_WIDTH) -> list[tuple]:
    """Step rows laid end to end, `width` values each, as a list of tuples."""
    return [tuple(flat[i : i + width]) for i in range(0, len(flat), width)]


def read_record(raw: bytes) -> tuple:
    """(op, execution id, seq or None, document or None) of a record, its payload not decoded
    (an event's op is `codec.OP_EVENT`, its document None). Raises ValueError, KeyError or
    TypeError for bytes that are not a tracedb record."""
    if is_event(raw):
        f = split_event(raw)
        return OP_EVENT, f.execution_id, f.seq, None
    d = orjson.loads(raw)
    return d["op"], d["id"], d.get("seq"), d


def record_time(raw: bytes, d: Optional[dict] = None) -> int:
    """When a record was written (ns); `d`: its document, when decoded already."""
    if d is not None:
        return d["t"]
    return split_event(raw).t if is_event(raw) else orjson.loads(raw)["t"]


def fork_parent(raw: bytes) -> Optional[str]:
    """The parent execution a start record forks from, None for any other record (cheap: an
    event, or a document that does not name a parent, is not decoded)."""
    if is_event(raw) or b'"parent"' not in raw:
        return None
    return orjson.loads(raw).get("parent")


class Fold:
    """The row changes of a run of WAL records, in LSN order.

    `new`: execution id -> the whole row of an execution these records started.
    `upd`: execution id -> the row of an execution they did not start: with `held=None` the
    changes to make (a delta), else the held row itself, folded in place.
    `steps`: step rows laid end to end (`STEP_COLUMNS`), in LSN order.
    `restarted`: execution id -> LSN of a start that replaced an earlier execution of that id
    (module doc); with `held=None` only those whose earlier records are in this fold.
    `skipped`: records not applied (a row another recorder owns, an execution with no row).
    `bad_decisions`: LSNs of ROUTER_DECISION events whose payload is not JSON (a WAL written
    before the store refused such payloads): kept as steps, not as the row's decision.
    """

    __slots__ = ("recorder_id", "held", "foreign", "new", "upd", "steps", "ends", "restarted",
                 "skipped", "bad_decisions", "starts", "skip_unknown")

    def __init__(self, recorder_id: str, held: Optional[dict] = None, foreign: frozenset = frozenset(),
                 *, skip_unknown: bool = False):
        """`held`: execution id -> the database's row (a dict of its columns, changed in place),
        None when the database is not read while folding (the compactor). `foreign`: the ids of
        `held` another recorder owns. A record of an op this version does not know (a newer
        tracedb wrote it) raises IntegrityError, or is skipped with `skip_unknown` (a read shows
        what it can; compaction stops at it)."""
        self.recorder_id = recorder_id
        self.skip_unknown = skip_unknown
        self.held = held
        self.foreign = foreign
        self.new: dict = {}
        self.upd: dict = {}
        self.steps: list = []
        # Per execution, the frame of its last event not yet folded into its row: one dict store
        # per event instead of finding the row; folded in before any other record of that
        # execution applies, and by `end()`.
        self.ends: dict = {}
        self.restarted: dict = {}
        self.starts: dict = {}  # execution id -> LSN of the start that made its row in `new`
        self.skipped = 0
        self.bad_decisions: list = []

    def row(self, eid: str, owned: bool = True) -> Optional[dict]:
        """The row records of `eid` fold into; None when they are skipped: no row is held for it,
        or another recorder owns it and `owned` (the change is the owner's alone)."""
        row = self.new.get(eid)
        if row is not None:
            return row
        row = self.upd.get(eid)
        if row is not None:
            return None if owned and eid in self.foreign else row
        held = self.held
        if held is None:
            row = self.upd[eid] = {}
            return row
        row = held.get(eid)
        if row is None or (owned and eid in self.foreign):
            return None
        self.upd[eid] = row
        return row

    def add(self, recs, hinted: bool = False) -> None:
        """Fold records in LSN order: (lsn, record bytes), or (lsn, record bytes, hint) when
        `hinted` (a hint: the event's `codec.EventFrame`, or None). An event's derived columns
        come from its hint's `facts` when it has them, else from its payload, decoded only when
        `outcomes.may_matter` says it can change them."""
        new, steps, ends = self.new, self.steps, self.ends
        loads = orjson.loads
        held = self.held
        for rec in recs:
            lsn = rec[0]
            raw = rec[1]
            frame = rec[2] if hinted else None
            if frame is None:
                if raw[0] != EVENT_TAG:
                    self.doc(loads(raw), lsn)
                    continue
                frame = split_event(raw)
            eid, seq, type_, at, t, facts = frame
            if held is not None and eid not in new and self.row(eid) is None:
                self.skipped += 1
                continue
            body = raw[at:]
            # The payload's checksum is over the very bytes written (tracedb.projection.checksums).
            steps += (eid, seq, type_, body.decode(), t, lsn, crc32c(body))
            ends[eid] = frame
            if facts is None:
                if may_matter(type_, body):
                    try:
                        fold_event(self.row(eid), seq, type_, loads(body), t)
                    except orjson.JSONDecodeError:
                        pass  # not JSON (see bad_decisions): it records no error and no usage
            elif facts:
                fold_facts(self.row(eid), seq, type_, facts, t)
            if type_ == ROUTER_DECISION:
                try:
                    self.row(eid)["router_decision"] = loads(body)
                except orjson.JSONDecodeError:
                    self.bad_decisions.append(lsn)

    def doc(self, d: dict, lsn: int) -> None:
        """One record other than a framed event: start, finish, or a status change."""
        op = d["op"]
        eid = d["id"]
        end = self.ends.pop(eid, None)
        if op == OP_START:
            self._start(d, eid, lsn)
            return
        if op not in (OP_FINISH, OP_INCOMPLETE, OP_INVALIDATE, OP_RECORDING_FAILURE):
            if self.skip_unknown:
                self.skipped += 1
                return
            raise IntegrityError(
                f"WAL record {lsn} has an unknown op {op!r}",
                hint="this WAL was written by a newer tracedb; upgrade before compacting",
            )
        if end is not None:
            row = self.row(eid)
            if row is not None:
                _set_end(row, end)
        row = self.row(eid, op not in ANY_RECORDER_OPS)
        if row is None:
            self.skipped += 1
            return
        t = d["t"]
        row["updated_at_ns"] = t
        if op == OP_FINISH:
            seq = d["seq"]
            response = d.get("response")
            data = orjson.dumps(response)
            self.steps += (eid, seq, FINAL_RESPONSE, data.decode(), t, lsn, crc32c(data))
            row["last_seq"] = seq
            row["last_event_ns"] = t
            row["final_response"] = response
            outcomes.fold_finish(row, seq, response)
        elif op != OP_RECORDING_FAILURE:
            outcomes.fold_closed(row)
        transition(row, op, d)

    def _start(self, d: dict, eid: str, lsn: int) -> None:
        if eid in self.foreign:
            self.skipped += 1  # another recorder's execution: its owner's records are skipped
            return
        held = self.held
        if eid in self.new or eid in self.upd or (held is not None and eid in held):
            # The earlier execution of this id is replaced, its steps in this fold dropped.
            self.restarted[eid] = lsn
            self.upd.pop(eid, None)
            if any(self.steps[i] == eid for i in range(0, len(self.steps), STEP_WIDTH)):
                self.steps[:] = [v for s in steps_of(self.steps) if s[0] != eid for v in s]
        self.new[eid] = new_row(d, self.recorder_id)
        self.starts[eid] = lsn

    def end(self) -> None:
        """Fold each execution's last event into its row: call once all records are added."""
        for eid, end in self.ends.items():
            _set_end(self.row(eid, False), end)
        self.ends.clear()

    def step_count(self) -> int:
        return len(self.steps) // STEP_WIDTH


def _set_end(row: dict, end: EventFrame) -> None:
    """Fold an execution's last event so far (its frame) into its row."""
    row["last_seq"] = end[1]
    row["updated_at_ns"] = row["last_event_ns"] = end[4]


def close_left_running(row: dict, note: str) -> None:
    """An execution no recorder will finish, as recovery closes it: incomplete."""
    transition(row, OP_INCOMPLETE, {"why": note})
    outcomes.fold_closed(row)


def fold(records, recorder_id: str, held: Optional[dict] = None, foreign: frozenset = frozenset(),
         *, skip_unknown: bool = False) -> Fold:
    """The row changes of `records`, (lsn, record bytes) in LSN order (see `Fold`)."""
    f = Fold(recorder_id, held, foreign, skip_unknown=skip_unknown)
    f.add(records)
    f.end()
    return f
