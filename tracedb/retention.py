"""Retention: delete old traces, give the space back, honour pins and fork lineage.

Works on the database alone, never the WAL, so it is safe to run from cron next to a running
recorder: each batch is one short BEGIN IMMEDIATE transaction (the compactor waits at most that
long, thanks to busy_timeout), and only terminal traces are deleted, never one being recorded.
A trace is kept when it is pinned, or when it is the parent of a fork that is kept.

On PostgreSQL, where many recorders write at once, a batch that loses a deadlock or times out on
a row lock is retried; space is given back by a plain VACUUM of the two tables (reusable at once,
trailing empty pages returned to the file system), never VACUUM FULL, which would lock every
recorder out for as long as it rewrites the tables.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from . import db
from .errors import ExecutionNotFoundError, InvalidInputError
from .models import TERMINAL_STATUSES, trace_steps, traces
from .record import REASON_MANUALLY_INVALIDATED, STATUS_INVALIDATED

log = logging.getLogger(__name__)

_BATCH_ATTEMPTS = 5


@dataclass(frozen=True)
class PruneResult:
    """What prune deleted (or, with dry_run, would delete) and what it kept."""

    deleted_traces: int = 0
    deleted_steps: int = 0
    kept_pinned: int = 0
    kept_parents: int = 0
    batches: int = 0
    bytes_freed: int = 0
    dry_run: bool = False


def _db_files(engine: Engine) -> list[str]:
    if engine.dialect.name != "sqlite" or not engine.url.database:
        return []
    base = engine.url.database
    return [base, base + "-wal"]


def _size(files: list[str]) -> int:
    total = 0
    for f in files:
        try:
            total += os.path.getsize(f)
        except OSError:
            pass
    return total


def _candidates(cutoff_ns: int):
    t = traces.c
    child = traces.alias("child")
    return (
        sa.select(t.execution_id)
        .where(t.status.in_(TERMINAL_STATUSES))
        .where(t.created_at_ns < cutoff_ns)
        .where(t.pinned == sa.false())
        .where(~sa.exists().where(child.c.parent_execution_id == t.execution_id))
    )


def _plan(conn, cutoff_ns: int) -> tuple[set, int, int]:
    """Dry run: the traces prune would delete (transitively through forks) and what it keeps."""
    t = traces.c
    old = (
        sa.select(t.execution_id, t.pinned)
        .where(t.status.in_(TERMINAL_STATUSES))
        .where(t.created_at_ns < cutoff_ns)
    )
    rows = conn.execute(old).all()
    deletable = {r[0] for r in rows if not r[1]}
    pinned = sum(1 for r in rows if r[1])
    edges = conn.execute(
        sa.select(t.execution_id, t.parent_execution_id).where(t.parent_execution_id.is_not(None))
    ).all()
    # A parent stays while any of its forks stays; repeat until nothing changes.
    changed = True
    while changed:
        changed = False
        for child_id, parent_id in edges:
            if parent_id in deletable and child_id not in deletable:
                deletable.discard(parent_id)
                changed = True
    kept_parents = len(rows) - pinned - len(deletable)
    return deletable, pinned, kept_parents


def prune(
    engine: Engine,
    older_than_s: float,
    *,
    now_ns: int,
    dry_run: bool = False,
    batch_traces: int = 500,
    progress: Optional[Callable[[int, int], None]] = None,
) -> PruneResult:
    """Delete terminal, unpinned traces created more than `older_than_s` ago, with their steps.

    Idempotent: a second run deletes nothing more. Then reclaims space (incremental vacuum, and
    a truncating checkpoint of SQLite's own WAL).
    """
    if older_than_s < 0:
        raise InvalidInputError(f"older_than must not be negative, got {older_than_s}")
    cutoff = now_ns - int(older_than_s * 1e9)
    with engine.connect() as conn:
        deletable, pinned, kept_parents = _plan(conn, cutoff)
        conn.rollback()
        if dry_run:
            steps = 0
            ids = list(deletable)
            for i in range(0, len(ids), 500):
                steps += conn.execute(
                    sa.select(sa.func.count())
                    .select_from(trace_steps)
                    .where(trace_steps.c.execution_id.in_(ids[i : i + 500]))
                ).scalar()
            return PruneResult(len(deletable), steps, pinned, kept_parents, 0, 0, True)
    total = len(deletable)
    files = _db_files(engine)
    before = _size(files) if engine.dialect.name == "sqlite" else _pg_size(engine)
    deleted = steps = batches = 0
    query = _candidates(cutoff).order_by(traces.c.created_at_ns).limit(batch_traces)
    while True:
        n_traces, n_steps = _delete_batch(engine, query)
        if not n_traces:
            break
        deleted += n_traces
        steps += n_steps
        batches += 1
        if progress is not None:
            progress(deleted, max(total, deleted))
    freed = 0
    if engine.dialect.name == "sqlite" and deleted:
        _reclaim(engine)
        freed = max(0, before - _size(files))
    elif engine.dialect.name == "postgresql" and deleted:
        _vacuum_pg(engine)
        freed = max(0, before - _pg_size(engine))
    _, pinned_after, parents_after = _plan_counts(engine, cutoff)
    return PruneResult(deleted, steps, pinned_after, parents_after, batches, freed, False)


def _delete_batch(engine: Engine, query) -> tuple[int, int]:
    """Delete one batch of candidates in one transaction; (traces, steps) deleted."""
    attempt = 0
    while True:
        attempt += 1
        try:
            with engine.begin() as conn:
                # Sorted: rows are locked in execution-id order, as the compactor does.
                ids = sorted(conn.execute(query).scalars().all())
                if not ids:
                    return 0, 0
                n_steps = conn.execute(
                    trace_steps.delete().where(trace_steps.c.execution_id.in_(ids))
                ).rowcount
                n_traces = conn.execute(traces.delete().where(traces.c.execution_id.in_(ids))).rowcount
                return n_traces, n_steps
        except sa.exc.DBAPIError as e:
            state = db.sqlstate(e)
            if state not in db.RETRY_SQLSTATES or attempt >= _BATCH_ATTEMPTS:
                raise
            log.warning("prune batch hit %s (SQLSTATE %s); running it again", type(e.orig).__name__, state)


def _pg_size(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT pg_total_relation_size('traces') + pg_total_relation_size('trace_steps')"
            ).scalar()
        )


def _vacuum_pg(engine: Engine) -> None:
    """A plain VACUUM: makes the deleted rows' space reusable and truncates empty trailing pages.
    It takes no lock that blocks the recorders' reads or writes."""
    with engine.connect() as conn:
        # VACUUM cannot run inside a transaction block.
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        auto.exec_driver_sql("VACUUM (ANALYZE) trace_steps, traces")


VACUUM_PAGES_PER_STEP = 2048


def _reclaim(engine: Engine) -> None:
    """Give freed pages back to the file system, a bounded number of pages per write lock."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        while raw.execute("PRAGMA freelist_count").fetchone()[0] > 0:
            # executescript steps the pragma to completion; a plain execute frees one page.
            raw.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES_PER_STEP});")
        # Move SQLite's own WAL into the file and cut it to zero bytes.
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def _plan_counts(engine: Engine, cutoff: int) -> tuple[int, int, int]:
    with engine.connect() as conn:
        deletable, pinned, kept_parents = _plan(conn, cutoff)
    return len(deletable), pinned, kept_parents


def set_pinned(engine: Engine, execution_id: str, pinned: bool) -> None:
    """Pin or unpin a trace in one short transaction; ExecutionNotFoundError if it is not stored."""
    with engine.begin() as conn:
        n = conn.execute(
            traces.update().where(traces.c.execution_id == execution_id).values(pinned=pinned)
        ).rowcount
    if n != 1:
        raise ExecutionNotFoundError(
            execution_id,
            hint="list executions with `tracedb inspect --list`; a trace recorded within the last "
            "moment may not be compacted yet",
        )


def invalidate_in_db(engine: Engine, execution_id: str, reason: str, now_ns: int) -> bool:
    """Invalidate a trace directly in the database (the CLI, next to a running recorder).

    Returns False if it was already invalidated. The compactor never overwrites `invalidated`,
    and the running recorder stops accepting events for it once it notices (see store.py).
    """
    t = traces.c
    with engine.begin() as conn:
        # FOR UPDATE (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises): two operators
        # invalidating at once cannot both see "not invalidated yet".
        status = conn.execute(
            sa.select(t.status).where(t.execution_id == execution_id).with_for_update()
        ).scalar()
        if status is None:
            raise ExecutionNotFoundError(
                execution_id,
                hint="list executions with `tracedb inspect --list`; a trace recorded within the "
                "last moment may not be compacted yet",
            )
        if status == STATUS_INVALIDATED:
            return False
        conn.execute(
            traces.update()
            .where(t.execution_id == execution_id)
            .values(
                status=STATUS_INVALIDATED,
                replayable=False,
                replayable_reason=REASON_MANUALLY_INVALIDATED,
                status_note=reason,
                updated_at_ns=now_ns,
            )
        )
    return True
