"""Verification of stored traces: envelope hash, event order, lifecycle, database integrity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from . import db
from .errors import ExecutionNotFoundError
from .models import trace_steps, traces
from .record import FINAL_RESPONSE, STATUS_COMPLETED, compute_envelope_hash, normalize_envelope_hash


@dataclass(frozen=True)
class VerifyResult:
    """Counts of what was checked, and every problem found (empty: all good)."""

    checked_traces: int = 0
    checked_steps: int = 0
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_trace(row, steps: list, problems: list) -> None:
    eid = row.execution_id
    stored = normalize_envelope_hash(row.envelope_hash)
    computed = compute_envelope_hash(row.envelope)
    if stored != computed:
        problems.append(f"{eid}: envelope hash {stored} does not match the envelope ({computed})")
    expected = 1
    for seq, type_ in steps:
        if seq != expected:
            problems.append(f"{eid}: event seq {seq} where {expected} was expected")
            expected = seq
        expected += 1
    last = steps[-1][0] if steps else 0
    if last != row.last_seq:
        problems.append(f"{eid}: last_seq is {row.last_seq} but the last event has seq {last}")
    finals = [seq for seq, type_ in steps if type_ == FINAL_RESPONSE]
    if row.status == STATUS_COMPLETED:
        if row.final_response is None or not finals:
            problems.append(f"{eid}: completed without a FINAL_RESPONSE")
        elif finals[-1] != last:
            problems.append(f"{eid}: events recorded after FINAL_RESPONSE (seq {finals[-1]})")
    if len(finals) > 1:
        problems.append(f"{eid}: {len(finals)} FINAL_RESPONSE events")


def verify(engine: Engine, execution_id: Optional[str] = None) -> VerifyResult:
    """Verify one trace, or every trace plus the database's own integrity checks."""
    problems: list[str] = []
    n_traces = n_steps = 0
    with engine.connect() as conn, conn.begin():
        q = sa.select(traces).order_by(traces.c.execution_id)
        sq = sa.select(trace_steps.c.execution_id, trace_steps.c.seq, trace_steps.c.type).order_by(
            trace_steps.c.execution_id, trace_steps.c.seq
        )
        if execution_id is not None:
            q = q.where(traces.c.execution_id == execution_id)
            sq = sq.where(trace_steps.c.execution_id == execution_id)
        rows = conn.execute(q)
        steps_iter = iter(conn.execute(sq))
        pending = next(steps_iter, None)
        for row in rows:
            steps = []
            # Both queries are ordered by execution id: walk them side by side.
            while pending is not None and pending[0] < row.execution_id:
                problems.append(f"{pending[0]}: step {pending[1]} has no trace")
                pending = next(steps_iter, None)
            while pending is not None and pending[0] == row.execution_id:
                steps.append((pending[1], pending[2]))
                pending = next(steps_iter, None)
            _check_trace(row, steps, problems)
            n_traces += 1
            n_steps += len(steps)
        while pending is not None:
            problems.append(f"{pending[0]}: step {pending[1]} has no trace")
            pending = next(steps_iter, None)
    if execution_id is not None and n_traces == 0:
        raise ExecutionNotFoundError(execution_id)
    if execution_id is None:
        problems.extend(db.integrity_check(engine))
    return VerifyResult(n_traces, n_steps, tuple(problems))
