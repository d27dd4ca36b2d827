"""Verification of stored traces: envelope hash, event order, lifecycle, the per-row checksums of
the stored values (`tracedb.projection.checksums`), database integrity.

The whole-store walk streams: traces are read in execution-id order, `CHUNK_TRACES` at a time
(keyset over the primary key), each chunk with the steps whose execution id falls in its range,
in one short read transaction. Every step's payload is read, to check it against its checksum;
the steps stream through (one at a time in memory) and are summed up per trace on the way
(count, first and last seq, FINAL_RESPONSE events, the seqs whose payload changed). Memory depends on the chunk, not on the store,
and a recorder compacting next to it is never held up by one long snapshot. Each chunk is one
consistent view (REPEATABLE READ on PostgreSQL, SQLite's snapshot of the transaction), so a
trace and its steps are always checked as of the same moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tracedb.projection import db
from tracedb.projection.checksums import TRACE_VALUE_COLUMNS, crc_column, damaged_columns, of_stored
from tracedb.errors import ExecutionNotFoundError
from tracedb.projection.models import trace_steps, traces
from tracedb.records.record import FINAL_RESPONSE, REASON_RECORD_CORRUPTED, STATUS_COMPLETED, compute_envelope_hash, stored_envelope_hash
from tracedb.reads.sqlite import json_value

# Traces per read transaction of the whole-store walk; their steps come in the same transaction.
CHUNK_TRACES = 1000
# Rows a PostgreSQL server-side cursor hands over at a time.
_ROWS_PER_FETCH = 5000


@dataclass(frozen=True)
class VerifyResult:
    """Counts of what was checked, and every problem found (empty: all good)."""

    checked_traces: int = 0
    checked_steps: int = 0
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _trace_columns(dialect: str) -> tuple:
    """What a trace's check needs, and nothing more: the checked value columns undecoded, with
    their checksums (meta holds the stored envelope's hash when redaction rewrote it)."""
    return (
        traces.c.execution_id,
        traces.c.envelope,
        traces.c.envelope_hash,
        traces.c.status,
        traces.c.last_seq,
        traces.c.replayable_reason,
        *(db.undecoded(traces.c[c], dialect) for c in TRACE_VALUE_COLUMNS),
        *(traces.c[crc_column(c)] for c in TRACE_VALUE_COLUMNS),
    )


def _hash_problem(row) -> Optional[str]:
    stored = stored_envelope_hash(row.envelope_hash, json_value(row.meta))
    computed = compute_envelope_hash(row.envelope)
    if stored != computed:
        return f"{row.execution_id}: envelope hash {stored} does not match the envelope ({computed})"
    return None


def _end_problems(row, last: int, finals: int, last_final: int, problems: list) -> None:
    """The checks of a trace once all its steps were seen: `last` is the seq of its last step
    (0: none), `finals` how many were FINAL_RESPONSE, `last_final` the seq of the last of those."""
    eid = row.execution_id
    if last != row.last_seq:
        problems.append(f"{eid}: last_seq is {row.last_seq} but the last event has seq {last}")
    if row.status == STATUS_COMPLETED:
        if row.final_response is None or not finals:
            problems.append(f"{eid}: completed without a FINAL_RESPONSE")
        elif last_final != last:
            problems.append(f"{eid}: events recorded after FINAL_RESPONSE (seq {last_final})")
    if finals > 1:
        problems.append(f"{eid}: {finals} FINAL_RESPONSE events")


def _seq_problems(eid: str, seqs: Iterable[int], problems: list) -> None:
    """The gaps and repeats in a trace's seqs (in order), each where it is first seen."""
    expected = 1
    for seq in seqs:
        if seq != expected:
            problems.append(f"{eid}: event seq {seq} where {expected} was expected")
            expected = seq
        expected += 1


def _seqs(conn: Connection, eid: str) -> Iterable[int]:
    return conn.execute(
        sa.select(trace_steps.c.seq).where(trace_steps.c.execution_id == eid).order_by(trace_steps.c.seq)
    ).scalars()


def _walk(conn: Connection, rows: list, summaries: Iterable, problems: list) -> tuple[int, int]:
    """Check `rows` (traces ordered by execution id) against `summaries`, one per execution id
    of the same range with steps (`_summaries`), side by side. Returns (traces, steps).

    A trace's seqs are read one by one only when its summary shows they are not exactly
    1..count, to report each gap as it comes; the steps of an execution id without a row are
    read to report each of them.

    Whether a summary belongs to a row of the chunk is asked of the chunk's ids, not of Python's
    string order, which a server's collation need not share. Steps without a trace (possible
    only in an SQLite file written with foreign keys off, whose order is Python's) are placed
    by that order, among the traces' own problems."""
    ids = {row.execution_id for row in rows}
    it = iter(summaries)
    pending = next(it, None)

    def orphans(eid: str) -> None:
        for seq in _seqs(conn, eid):
            problems.append(f"{eid}: step {seq} has no trace")

    n_traces = n_steps = 0
    for row in rows:
        eid = row.execution_id
        while pending is not None and pending[0] != eid and pending[0] not in ids and pending[0] < eid:
            orphans(pending[0])
            pending = next(it, None)
        problem = _hash_problem(row)
        if problem is not None:
            problems.append(problem)
        for column in damaged_columns(row._mapping):
            problems.append(f"{eid}: {column} does not match its checksum")
        last = finals = last_final = 0
        if pending is not None and pending[0] == eid:
            _, count, first, last, finals, last_final, damaged = pending
            pending = next(it, None)
            for seq in damaged:
                problems.append(f"{eid}: event seq {seq} payload does not match its checksum")
            # Seqs are unique (primary key): else exactly 1..count. Gaps in a trace marked
            # record_corrupted are a loss already recorded (a WAL salvage), not a new problem.
            if (first != 1 or last != count) and row.replayable_reason != REASON_RECORD_CORRUPTED:
                _seq_problems(eid, _seqs(conn, eid), problems)
            n_steps += count
        _end_problems(row, last, finals, last_final or 0, problems)
        n_traces += 1
    while pending is not None:
        orphans(pending[0])
        pending = next(it, None)
    return n_traces, n_steps


def _reader(conn: Connection) -> Connection:
    if conn.dialect.name == "postgresql":
        # One snapshot for all the chunk's statements (READ COMMITTED takes one per statement),
        # and results through a server-side cursor.
        return conn.execution_options(
            isolation_level="REPEATABLE READ", stream_results=True, max_row_buffer=_ROWS_PER_FETCH
        )
    return conn


def _steps_query(dialect: str, after: Optional[str], upto: Optional[str]):
    """Every step with an execution id in (after, upto], in (execution id, seq) order: what
    `_summaries` needs, the payload undecoded for its checksum."""
    s = trace_steps.c
    q = sa.select(s.execution_id, s.seq, s.type, db.undecoded(s.payload, dialect), s.payload_crc).order_by(
        s.execution_id, s.seq
    )
    if after is not None:
        q = q.where(s.execution_id > after)
    if upto is not None:
        q = q.where(s.execution_id <= upto)
    return q


def _summaries(steps: Iterable) -> Iterator[tuple]:
    """Per execution id of `steps` (`_steps_query`'s rows), in their order: how many steps, the
    first and last seq, how many FINAL_RESPONSE and the seq of the last (None: none), and the
    seqs whose payload no longer matches its checksum."""
    eid = None
    count = first = last = finals = 0
    last_final: Optional[int] = None
    damaged: list = []
    for step_eid, seq, type_, payload, crc in steps:
        if step_eid != eid:
            if eid is not None:
                yield eid, count, first, last, finals, last_final, damaged
            eid, count, first, finals, last_final, damaged = step_eid, 0, seq, 0, None, []
        count += 1
        last = seq
        if type_ == FINAL_RESPONSE:
            finals += 1
            last_final = seq
        if of_stored(payload) != crc:
            damaged.append(seq)
    if eid is not None:
        yield eid, count, first, last, finals, last_final, damaged


def _verify_one(engine: Engine, execution_id: str) -> VerifyResult:
    problems: list[str] = []
    with engine.connect() as base:
        conn = _reader(base)
        dialect = conn.dialect.name
        with conn.begin():
            rows = conn.execute(
                sa.select(*_trace_columns(dialect)).where(traces.c.execution_id == execution_id)
            ).all()
            if not rows:
                raise ExecutionNotFoundError(execution_id)
            steps = conn.execute(_steps_query(dialect, None, None).where(trace_steps.c.execution_id == execution_id))
            n_traces, n_steps = _walk(conn, rows, _summaries(steps), problems)
    return VerifyResult(n_traces, n_steps, tuple(problems))


def verify(
    engine: Engine, execution_id: Optional[str] = None, *, chunk_traces: Optional[int] = None
) -> VerifyResult:
    """Verify one trace, or every trace plus the database's own integrity checks.

    The whole-store walk reads `chunk_traces` traces (default CHUNK_TRACES) per transaction."""
    if execution_id is not None:
        return _verify_one(engine, execution_id)
    if chunk_traces is None:
        chunk_traces = CHUNK_TRACES
    if chunk_traces <= 0:
        raise ValueError(f"chunk_traces must be positive, got {chunk_traces}")
    problems: list[str] = []
    n_traces = n_steps = 0
    after: Optional[str] = None  # the last execution id of the previous chunk
    with engine.connect() as base:
        conn = _reader(base)
        dialect = conn.dialect.name
        while True:
            with conn.begin():
                q = sa.select(*_trace_columns(dialect)).order_by(traces.c.execution_id).limit(chunk_traces)
                if after is not None:
                    q = q.where(traces.c.execution_id > after)
                rows = conn.execute(q).all()
                # A short chunk is the last: its steps range is open-ended, so that steps after
                # the last trace, which belong to no trace, are reported too.
                upto = rows[-1].execution_id if len(rows) == chunk_traces else None
                t, s = _walk(conn, rows, _summaries(conn.execute(_steps_query(dialect, after, upto))), problems)
            n_traces += t
            n_steps += s
            if upto is None:
                break
            after = upto
    problems.extend(db.integrity_check(engine))
    return VerifyResult(n_traces, n_steps, tuple(problems))
