"""The read API's statements through SQLAlchemy: every read of PostgreSQL, and of a SQLite file
`tracedb.reads.sqlite` does not serve (a schema to migrate first, the store's own engine).

`tracedb.reads.reader` imports this module at its first read through an engine, never at its own
import: a read command on a current SQLite file goes through `tracedb.reads.sqlite` and loads no
SQLAlchemy (its import is most of such a command's start-up). Filters come checked, as the
arguments `sqlite_reads.page_rows` takes (`reads.Filter`); columns are named from
`tracedb.projection.schema`'s declarations, as sqlite_reads names them.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Iterable, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tracedb.projection import db
from tracedb.reads import sqlite as sqlite_reads
from tracedb.projection.checksums import TRACE_VALUE_COLUMNS
from tracedb.errors import ExecutionNotFoundError
from tracedb.projection.models import compaction_checkpoint, trace_steps, traces
from tracedb.records.record import STATUS_RUNNING

_IN_CHUNK = 500  # ids per IN (...) list


def summary_cols() -> tuple:
    """The columns a listing shows (`sqlite_reads.SUMMARY_COLUMNS`)."""
    return tuple(traces.c[name] for name in sqlite_reads.SUMMARY_COLUMNS)


def newest_first() -> tuple:
    # Newest first; the execution id breaks ties between executions created in the same nanosecond.
    return (traces.c.created_at_ns.desc(), traces.c.execution_id.desc())


def filtered(q, *, status=None, since_ns=None, until_ns=None, intent=None, search=None, replayable=None,
             outcome=None, model_json=None, error=None, min_cost=None, slower_than_ns=None):
    """`q`, a select from traces, restricted to the executions that match every filter given
    (checked already: `reads.Filter`); the SQL `sqlite_reads.page_rows` writes by hand."""
    c = traces.c
    if outcome is not None:
        q = q.where(c.outcome == outcome)
    if model_json is not None:
        q = q.where(sa.cast(c.models, sa.Text).contains(model_json, autoescape=True))
    if error is not None:
        q = q.where(c.error_code == error)
    if min_cost is not None:
        q = q.where(c.cost_usd >= min_cost)
    if slower_than_ns is not None:
        q = q.where(c.outcome != "running").where(c.last_event_ns - c.created_at_ns > slower_than_ns)
    if replayable is not None:
        q = q.where(c.replayable == replayable)
    if status is not None:
        q = q.where(c.status == status)
    if since_ns is not None:
        q = q.where(c.created_at_ns >= since_ns)
    if until_ns is not None:
        q = q.where(c.created_at_ns < until_ns)
    if intent is not None:
        q = q.where(c.intent == intent)
    if search:
        q = q.where(c.intent.icontains(search, autoescape=True))
    return q


def without(q, ids: Sequence[str]):
    """`q`, a select from traces, without the executions `ids`."""
    ids = list(ids)
    if not ids:
        return q
    return q.where(*(traces.c.execution_id.not_in(ids[i : i + _IN_CHUNK]) for i in range(0, len(ids), _IN_CHUNK)))


def steps_stmt(execution_id: str):
    """An execution's steps (seq, type, payload decoded, recorded_at_ns) in seq order."""
    s = trace_steps.c
    return sa.select(s.seq, s.type, s.payload, s.recorded_at_ns).where(s.execution_id == execution_id).order_by(s.seq)


def checked_steps(conn, execution_id: str) -> list:
    """The steps of an execution in seq order, each payload checked against its checksum."""
    s = trace_steps.c
    cols = [db.undecoded(s[n], conn.dialect.name) if n == "payload" else s[n] for n in sqlite_reads.STEP_COLUMNS]
    q = sa.select(*cols).where(s.execution_id == execution_id).order_by(s.seq)
    return [sqlite_reads.checked_step(r._mapping) for r in conn.execute(q)]


def load(engine: Engine, execution_id: str):
    """The traces row and its steps (with their recorded times), from one snapshot, checked
    against their checksums (`sqlite_reads.checked_row`); ExecutionNotFoundError if none."""
    json_columns = {"envelope", "models", *TRACE_VALUE_COLUMNS}
    cols = [
        db.undecoded(traces.c[n], engine.dialect.name) if n in json_columns else traces.c[n]
        for n in sqlite_reads.TRACE_COLUMNS
    ]
    with engine.connect() as conn, conn.begin():
        row = conn.execute(sa.select(*cols).where(traces.c.execution_id == execution_id)).first()
        if row is None:
            raise ExecutionNotFoundError(execution_id)
        steps = checked_steps(conn, execution_id)
    return SimpleNamespace(**sqlite_reads.checked_row(dict(row._mapping))), steps


def judged_rows(engine: Engine, ids: Sequence[str]) -> dict:
    """`sqlite_reads.judged_rows` through an engine (PostgreSQL): what a verdict on each of
    `ids` the database has reads, from one snapshot (REPEATABLE READ), two queries for a page of
    rows instead of a record read a row; payloads checked against their checksums as stored text."""
    t, s = traces.c, trace_steps.c
    dialect = engine.dialect.name
    json_columns = {"envelope", *TRACE_VALUE_COLUMNS}
    cols = [db.undecoded(t[n], dialect) if n in json_columns else t[n] for n in sqlite_reads.JUDGED_COLUMNS]
    step_cols = [db.undecoded(s[n], dialect) if n == "payload" else s[n] for n in sqlite_reads.JUDGED_STEP_COLUMNS]
    ids = list(ids)
    rows: list = []
    step_rows: list = []
    options = {"isolation_level": "REPEATABLE READ"} if dialect == "postgresql" else {}
    with engine.connect().execution_options(**options) as conn, conn.begin():
        for i in range(0, len(ids), _IN_CHUNK):
            rows += conn.execute(sa.select(*cols).where(t.execution_id.in_(ids[i : i + _IN_CHUNK]))).all()
        found = [r[0] for r in rows]
        for i in range(0, len(found), _IN_CHUNK):
            step_rows += conn.execute(
                sa.select(*step_cols).where(s.execution_id.in_(found[i : i + _IN_CHUNK])).order_by(s.execution_id, s.seq)
            ).all()
    return sqlite_reads.judged_from(rows, step_rows)


def trace_status(engine: Engine, execution_id: str) -> Optional[str]:
    """The stored status of an execution, None if the database has no such execution."""
    with engine.connect() as conn:
        return conn.execute(sa.select(traces.c.status).where(traces.c.execution_id == execution_id)).scalar()


def trace_status_and_last_seq(engine: Engine, execution_id: str) -> Optional[tuple[str, int]]:
    """The stored status and last seq of an execution, None if the database has no such execution."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(traces.c.status, traces.c.last_seq).where(traces.c.execution_id == execution_id)
        ).first()
    return None if row is None else (row.status, row.last_seq)


def oldest_first_rows(engine: Engine, args: dict, limit: Optional[int]) -> list:
    """The listed rows (mappings) that match the checked filters `args`, oldest first."""
    q = filtered(sa.select(*summary_cols()).order_by(traces.c.created_at_ns, traces.c.execution_id), **args)
    if limit is not None:
        q = q.limit(limit)
    with engine.connect() as conn:
        return [r._mapping for r in conn.execute(q).all()]


def prefix_range(prefix: str):
    """The ids that start with `prefix`, as a range of the primary key (SQLite)."""
    col = traces.c.execution_id
    if not prefix:
        return sa.false()
    if ord(prefix[-1]) == 0x10FFFF:
        return col.startswith(prefix)
    return (col >= prefix) & (col < prefix[:-1] + chr(ord(prefix[-1]) + 1))


def resolve_stmts(dialect: str, prefix: str, limit: int):
    """(the exact id, up to `limit` ids that start with `prefix`)."""
    col = traces.c.execution_id
    # SQLite's LIKE ignores case and uses no index, hence the range; PostgreSQL's LIKE is
    # exact, and served by the primary key under the C collation.
    match = prefix_range(prefix) if dialect == "sqlite" else col.startswith(prefix, autoescape=True)
    exact = sa.select(col).where(col == prefix)
    return exact, sa.select(col).where(match).order_by(col).limit(limit)


def page_stmt(args: dict, before: Optional[tuple[int, str]], n: int, leave_out: Sequence[str]):
    """Up to `n` listed rows that match the checked filters `args`, newest first, after the
    position `before` (created_at_ns, execution_id), none of `leave_out`."""
    last_at = (
        sa.select(trace_steps.c.recorded_at_ns)
        .where(trace_steps.c.execution_id == traces.c.execution_id)
        .where(trace_steps.c.seq == traces.c.last_seq)
        .scalar_subquery()
    )
    q = filtered(sa.select(*summary_cols(), last_at.label("last_event_at_ns")), **args)
    if before is not None:
        q = q.where(sa.tuple_(traces.c.created_at_ns, traces.c.execution_id) < sa.tuple_(*before))
    return without(q.order_by(*newest_first()).limit(n), leave_out)


def count_stmt(args: dict, leave_out: Sequence[str]):
    """How many executions match the checked filters `args`, none of `leave_out`."""
    return without(filtered(sa.select(sa.func.count()).select_from(traces), **args), leave_out)


def status_counts_stmt(args: dict, leave_out: Sequence[str]):
    """(status, count) of the executions that match `args`, none of `leave_out`."""
    q = sa.select(traces.c.status, sa.func.count()).group_by(traces.c.status)
    return without(filtered(q, **args), leave_out)


def bounded_count_stmt(args: dict, at_most: int, leave_out: Sequence[str]):
    """A count of the matches of `args` (none of `leave_out`) that stops at `at_most` + 1."""
    inner = without(filtered(sa.select(sa.literal(1)).select_from(traces), **args), leave_out)
    return sa.select(sa.func.count()).select_from(inner.limit(at_most + 1).subquery())


def progress_stmts(execution_id: str, after_seq: int, limit: int):
    """(an execution's progress columns, its steps after `after_seq`, at most `limit`)."""
    t = traces.c
    head = sa.select(t.status, t.replayable, t.replayable_reason, t.last_seq).where(t.execution_id == execution_id)
    return head, steps_stmt(execution_id).where(trace_steps.c.seq > after_seq).limit(limit)


def event_stmt(execution_id: str, seq: int):
    return steps_stmt(execution_id).where(trace_steps.c.seq == seq)


def parent_stmt(execution_id: str):
    t = traces.c
    return sa.select(t.parent_execution_id, t.forked_at_seq).where(t.execution_id == execution_id)


def forks_stmt(execution_id: str):
    t = traces.c
    return (
        sa.select(t.execution_id, t.forked_at_seq)
        .where(t.parent_execution_id == execution_id)
        .order_by(t.created_at_ns, t.execution_id)
    )


def status_notes(engine: Engine, ids: Sequence[str]) -> dict:
    """{id: its status note} of the executions of `ids` the database holds."""
    notes: dict = {}
    with engine.connect() as conn:
        for i in range(0, len(ids), _IN_CHUNK):
            q = sa.select(traces.c.execution_id, traces.c.status_note).where(
                traces.c.execution_id.in_(ids[i : i + _IN_CHUNK])
            )
            notes.update(conn.execute(q).all())
    return notes


# What the WAL's read (`tracedb.reads.wal_tail`) reads of the database through an engine.


def rows_by_id(conn, ids: Iterable[str]) -> dict:
    """The `traces` rows (as dicts) of `ids`, with the time of each one's last event."""
    ids = list(ids)
    out: dict = {}
    last_at = (
        sa.select(trace_steps.c.recorded_at_ns)
        .where(trace_steps.c.execution_id == traces.c.execution_id)
        .where(trace_steps.c.seq == traces.c.last_seq)
        .scalar_subquery()
        .label("_last_event_at_ns")
    )
    for i in range(0, len(ids), _IN_CHUNK):
        q = sa.select(traces, last_at).where(traces.c.execution_id.in_(ids[i : i + _IN_CHUNK]))
        for r in conn.execute(q):
            out[r.execution_id] = dict(r._mapping)
    return out


def applied_lsn(engine: Engine, recorder_id: str) -> Optional[int]:
    """The database's applied LSN: this recorder's (all recorders' highest without `recorder_id`)."""
    with engine.connect() as conn:
        q = sa.select(sa.func.max(compaction_checkpoint.c.applied_lsn))
        if recorder_id:
            q = q.where(compaction_checkpoint.c.recorder_id == recorder_id)
        return conn.execute(q).scalar()


def running_with_rows(engine: Engine, recorder_id: str, ids: Iterable[str]) -> tuple[set, dict]:
    """The executions of `recorder_id` still running, and the rows of those and of `ids` (`rows_by_id`), read together."""
    running_q = sa.select(traces.c.execution_id).where(traces.c.status == STATUS_RUNNING)
    if recorder_id:
        running_q = running_q.where(traces.c.recorder_id == recorder_id)
    with engine.connect() as conn, conn.begin():
        running = set(conn.execute(running_q).scalars())
        return running, rows_by_id(conn, {*ids, *running})
