"""Reads of the projection, shared by the store and the CLI's read commands.

They take an engine, never the WAL, so they work next to a running recorder (SQLite WAL mode lets
readers and the compactor proceed together).
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional, Union

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .errors import ExecutionNotFoundError, InvalidInputError
from .models import trace_steps, traces
from .record import (
    STATUSES,
    ExecutionEvent,
    ExecutionHeader,
    ExecutionRecord,
    TraceSummary,
    utc_iso,
)

TimeArg = Union[None, int, float, datetime]

_SUMMARY_COLS = (
    traces.c.execution_id,
    traces.c.created_at_ns,
    traces.c.updated_at_ns,
    traces.c.intent,
    traces.c.status,
    traces.c.replayable,
    traces.c.replayable_reason,
    traces.c.last_seq,
    traces.c.pinned,
    traces.c.parent_execution_id,
)


def to_ns(value: TimeArg, name: str) -> Optional[int]:
    """A time argument as nanoseconds: an aware datetime, or seconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInputError(
                f"{name} must be timezone-aware", hint="use datetime.now(timezone.utc) or an ISO time with Z"
            )
        return int(value.timestamp() * 1e9)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1e9)
    raise InvalidInputError(f"{name} must be a datetime or seconds since the epoch, not {type(value).__name__}")


def record_from_rows(row, steps) -> ExecutionRecord:
    """Build seed 000's ExecutionRecord from a traces row and its steps in seq order."""
    return ExecutionRecord(
        header=ExecutionHeader(
            executionId=row.execution_id,
            createdUtcIso=utc_iso(row.created_at_ns),
            envelopeHash=row.envelope_hash,
            replayable=bool(row.replayable),
            replayableReason=row.replayable_reason,
        ),
        envelope=row.envelope,
        routerDecision=row.router_decision,
        events=[ExecutionEvent(seq=s.seq, type=s.type, payload=s.payload) for s in steps],
        finalResponse=row.final_response,
        status=row.status,
        intent=row.intent,
        parentExecutionId=row.parent_execution_id,
        forkedAtSeq=row.forked_at_seq,
    )


def read_record(engine: Engine, execution_id: str) -> ExecutionRecord:
    """The whole record of one execution; ExecutionNotFoundError if there is none."""
    with engine.connect() as conn, conn.begin():
        # One transaction: the header and the steps come from the same snapshot.
        row = conn.execute(sa.select(traces).where(traces.c.execution_id == execution_id)).first()
        if row is None:
            raise ExecutionNotFoundError(execution_id)
        steps = conn.execute(
            sa.select(trace_steps.c.seq, trace_steps.c.type, trace_steps.c.payload)
            .where(trace_steps.c.execution_id == execution_id)
            .order_by(trace_steps.c.seq)
        ).all()
    return record_from_rows(row, steps)


def trace_status(engine: Engine, execution_id: str) -> Optional[str]:
    """The stored status of an execution, None if the database has no such execution."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(traces.c.status).where(traces.c.execution_id == execution_id)
        ).scalar()


def list_traces(
    engine: Engine,
    *,
    status: Optional[str] = None,
    since: TimeArg = None,
    until: TimeArg = None,
    limit: Optional[int] = None,
) -> list[TraceSummary]:
    """Executions by creation time (oldest first), filtered by status and a creation-time window."""
    q = sa.select(*_SUMMARY_COLS).order_by(traces.c.created_at_ns, traces.c.execution_id)
    if status is not None:
        if status not in STATUSES:
            raise InvalidInputError(
                f"unknown status {status!r}", hint="one of " + ", ".join(STATUSES)
            )
        q = q.where(traces.c.status == status)
    since_ns, until_ns = to_ns(since, "since"), to_ns(until, "until")
    if since_ns is not None:
        q = q.where(traces.c.created_at_ns >= since_ns)
    if until_ns is not None:
        q = q.where(traces.c.created_at_ns < until_ns)
    if limit is not None:
        if limit < 0:
            raise InvalidInputError("limit must not be negative")
        q = q.limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    return [
        TraceSummary(
            execution_id=r.execution_id,
            created_at_ns=r.created_at_ns,
            updated_at_ns=r.updated_at_ns,
            intent=r.intent,
            status=r.status,
            replayable=bool(r.replayable),
            replayable_reason=r.replayable_reason,
            last_seq=r.last_seq,
            pinned=bool(r.pinned),
            parent_execution_id=r.parent_execution_id,
        )
        for r in rows
    ]


def inspect_view(record: ExecutionRecord) -> dict:
    """Seed 002's `inspect ID` JSON: the payload of the last event is folded into `last_event`."""
    last = record.last_event
    last_event = None
    if last is not None:
        last_event = {"seq": last.seq, "type": last.type}
        if isinstance(last.payload, dict):
            for k, v in last.payload.items():
                last_event.setdefault(k, v)
        elif last.payload is not None:
            last_event["payload"] = last.payload
    return {
        "execution_id": record.execution_id,
        "status": record.status,
        "last_event": last_event,
        "replayable": record.header.replayable,
        "replayable_reason": record.header.replayableReason,
    }
