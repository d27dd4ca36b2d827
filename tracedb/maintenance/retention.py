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

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import wal

from tracedb.projection import db, rollup
from tracedb.backoff import Backoff
from tracedb.records.fold import fork_parent
from tracedb.errors import ExecutionNotFoundError, InvalidInputError
from tracedb.projection.models import TERMINAL_STATUSES, trace_steps, traces
from tracedb.records.record import REASON_MANUALLY_INVALIDATED, STATUS_INVALIDATED

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


def _is_candidate(t, cutoff):
    """Old enough, terminal and not pinned: deleted unless a fork made from it is kept."""
    return sa.and_(t.c.status.in_(TERMINAL_STATUSES), t.c.created_at_ns < cutoff, t.c.pinned == sa.false())


# The statements of a batch, built once with bound parameters: a batch only binds its values
# (the keyset position, the cutoff, its ids), so that the cost per batch is the database's.
_IDS = sa.bindparam("ids", expanding=True)
_CUTOFF = sa.bindparam("cutoff", type_=sa.BigInteger)


def _old_traces_statement():
    """The next :limit traces before the keyset position (:after_ns, :after_id), the
    (created_at_ns, execution_id) of the last one seen ((cutoff, "") to begin), newest first.
    One row-value comparison, which SQLite and PostgreSQL both turn into a range of
    ix_traces_created_id: each batch reads only its own rows."""
    t = traces.c
    return (
        sa.select(t.execution_id, t.created_at_ns, t.status, t.pinned)
        .where(
            sa.tuple_(t.created_at_ns, t.execution_id)
            < sa.tuple_(sa.bindparam("after_ns", type_=sa.BigInteger), sa.bindparam("after_id", type_=sa.String))
        )
        .order_by(t.created_at_ns.desc(), t.execution_id.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


def _kept_for_forks_statement():
    """Those of :ids with a descendant (a fork, a fork of a fork...) that prune keeps.

    A trace is kept when a fork made from it is kept, and a fork is kept when it is not a
    candidate itself or is kept for its own forks: so a candidate is kept exactly when a
    non-candidate hangs below it. Walks only the batch's own fork trees (ix_traces_parent);
    UNION, not UNION ALL, so that even a cycle of parents ends."""
    t = traces.c
    below = (
        sa.select(t.parent_execution_id.label("root"), t.execution_id.label("id"))
        .where(t.parent_execution_id.in_(_IDS))
        .cte("below", recursive=True)
    )
    fork = traces.alias("fork")
    below = below.union(
        sa.select(below.c.root, fork.c.execution_id).where(fork.c.parent_execution_id == below.c.id)
    )
    kept = traces.alias("kept")
    return (
        sa.select(below.c.root)
        .distinct()
        .select_from(below.join(kept, kept.c.execution_id == below.c.id))
        .where(sa.not_(_is_candidate(kept, _CUTOFF)))
    )


_OLD_TRACES = _old_traces_statement()
_KEPT_FOR_FORKS = _kept_for_forks_statement()
_COUNT_STEPS = sa.select(sa.func.count()).select_from(trace_steps).where(trace_steps.c.execution_id.in_(_IDS))
_DELETE_STEPS = trace_steps.delete().where(trace_steps.c.execution_id.in_(_IDS))
_DELETE_TRACES = traces.delete().where(traces.c.execution_id.in_(_IDS))


@dataclass
class _Batch:
    """What one batch saw and did; applied to the totals once its transaction committed."""

    last: Optional[tuple[int, str]] = None  # keyset position of its last row; None: walk done
    deleted: int = 0
    steps: int = 0
    pinned: int = 0
    parents: int = 0


def _run_batch(conn, cutoff_ns: int, after: tuple[int, str], limit: int, dry_run: bool,
               outside_parents: Optional[Callable[[], set]] = None, keep_rollup: bool = False) -> _Batch:
    """One batch in the caller's transaction: classify the next `limit` old traces, then delete
    (or, dry, count) those that go, with their steps. `outside_parents()` names the parents of
    forks the database does not hold yet (acknowledged in the WAL, not compacted): kept too.
    `keep_rollup`: the database keeps stats_rollup by batch (`rollup.present`)."""
    rows = conn.execute(_OLD_TRACES, {"after_ns": after[0], "after_id": after[1], "limit": limit}).all()
    b = _Batch(last=(rows[-1].created_at_ns, rows[-1].execution_id) if len(rows) == limit else None)
    candidates = []
    for r in rows:
        if r.status not in TERMINAL_STATUSES:
            continue  # running: never deleted, and not counted as kept either
        if r.pinned:
            b.pinned += 1
        else:
            candidates.append(r.execution_id)
    if not candidates:
        return b
    kept = set(conn.execute(_KEPT_FOR_FORKS, {"ids": candidates, "cutoff": cutoff_ns}).scalars())
    if outside_parents is not None:
        # Asked last, just before the delete: a fork acknowledged while the batch ran is seen.
        kept |= _with_ancestors(conn, outside_parents(), set(candidates))
    b.parents = len(kept)
    # Sorted: rows are locked in execution-id order, as the compactor does.
    ids = sorted(eid for eid in candidates if eid not in kept)
    if not ids:
        return b
    if dry_run:
        b.steps = conn.execute(_COUNT_STEPS, {"ids": ids}).scalar()
        b.deleted = len(ids)
    else:
        b.steps = conn.execute(_DELETE_STEPS, {"ids": ids}).rowcount
        # stats_rollup loses the batch's executions in one upsert a key, not six a row.
        with rollup.deferred(conn, keep_rollup) as delta:
            if delta is not None:
                for row in rollup.read(conn, ids).values():
                    delta.add_stored(row, -1)
            b.deleted = conn.execute(_DELETE_TRACES, {"ids": ids}).rowcount
    return b


def _with_ancestors(conn, parents: set, candidates: set) -> set:
    """Those of `candidates` that are in `parents` or an ancestor of one (a fork of a fork)."""
    kept: set = set()
    frontier = set(parents)
    seen: set = set()
    while frontier:
        seen |= frontier
        kept |= frontier & candidates
        rows = conn.execute(
            sa.select(traces.c.parent_execution_id).where(
                traces.c.execution_id.in_(sorted(frontier)), traces.c.parent_execution_id.is_not(None)
            )
        ).scalars()
        frontier = set(rows) - seen
    return kept


def _batch(conn, cutoff_ns: int, after, limit: int, dry_run: bool,
           outside_parents: Optional[Callable[[], set]] = None, keep_rollup: bool = False) -> _Batch:
    """One batch in one short transaction on `conn`, run again when it loses a deadlock or a
    lock wait."""
    backoff = Backoff(first_s=0.01, max_s=0.5)
    while True:
        try:
            with conn.begin():
                return _run_batch(conn, cutoff_ns, after, limit, dry_run, outside_parents, keep_rollup)
        except sa.exc.DBAPIError as e:
            state = db.sqlstate(e)
            if state not in db.RETRY_SQLSTATES or backoff.attempts + 1 >= _BATCH_ATTEMPTS:
                raise
            log.warning("prune batch hit %s (SQLSTATE %s); running it again", type(e.orig).__name__, state)
            time.sleep(backoff.next_delay())


# While prune walks, its connection leaves SQLite's WAL to grow to this many pages before it
# copies them into the database (the default is 1,000 pages, 4 MB): a batch's commit does not
# checkpoint pages the next batch writes again (b-tree interior, free-list and pointer-map
# pages), and the truncating checkpoint at the end copies each page once.
PRUNE_WAL_AUTOCHECKPOINT_PAGES = 16384

# The walk's connection settings on SQLite (`_walk_connection`), each set back afterwards:
# - the checkpoint interval above;
# - secure_delete FAST: deleted rows are zeroed inside the b-tree pages that keep them, and a
#   page freed whole is not written over with zeros (builds of SQLite differ in their default,
#   on or off): `_reclaim` then cuts every free page off the file or writes a moved page over
#   it, so no deleted row is left in the file either way, for less I/O than zeroing them;
# - synchronous NORMAL: a batch's commit does not fsync. Prune makes them durable before it
#   returns (`_reclaim`); a power cut in the middle of a walk can only undo whole batches
#   (their deltas to stats_rollup with them), which the next prune deletes again.
_WALK_PRAGMAS = (
    ("wal_autocheckpoint", str(PRUNE_WAL_AUTOCHECKPOINT_PAGES)),
    ("secure_delete", "FAST"),
    ("synchronous", "NORMAL"),
)


@contextlib.contextmanager
def _walk_connection(engine: Engine):
    """The one connection a prune walks with; on SQLite, with `_WALK_PRAGMAS` for the walk, set
    back before the connection goes back to the pool."""
    with engine.connect() as conn:
        if engine.dialect.name != "sqlite":
            yield conn
            return
        raw = conn.connection.driver_connection
        before = [(name, int(raw.execute(f"PRAGMA {name}").fetchone()[0])) for name, _ in _WALK_PRAGMAS]
        for name, value in _WALK_PRAGMAS:
            raw.execute(f"PRAGMA {name}={value}").fetchall()
        try:
            yield conn
        finally:
            for name, value in before:
                # secure_delete reads 2 for FAST, and is set to FAST by name only.
                raw.execute(f"PRAGMA {name}={'FAST' if name == 'secure_delete' and value == 2 else value}").fetchall()


def _estimate(engine: Engine, cutoff_ns: int) -> int:
    """How many traces are old, terminal and unpinned: the progress bar's first total (the
    fork parents kept come off it as the walk finds them)."""
    with engine.connect() as conn:
        n = conn.execute(
            sa.select(sa.func.count()).select_from(traces).where(_is_candidate(traces, cutoff_ns))
        ).scalar()
        conn.rollback()
    return int(n or 0)


def prune(
    engine: Engine,
    older_than_s: float,
    *,
    now_ns: int,
    dry_run: bool = False,
    batch_traces: int = 500,
    progress: Optional[Callable[[int, int], None]] = None,
    outside_parents: Optional[Callable[[], set]] = None,
) -> PruneResult:
    """Delete terminal, unpinned traces created more than `older_than_s` ago, with their steps.

    A trace is kept while a fork made from it is kept: forks in the database, and the forks
    `outside_parents()` names (the parents of forks acknowledged in a WAL and not compacted
    yet), asked by each batch just before it deletes.

    One walk over the traces created before the cutoff, newest first, `batch_traces` at a time
    by keyset, each batch one short transaction that decides and deletes: memory does not grow
    with the store, and a recorder compacting next to it waits at most one batch. A dry run is
    the same walk, counting instead of deleting, so its counts are the real run's. Newest first,
    a fork (created after its parent) goes before, or with, the trace it was made from.

    Idempotent: a second run deletes nothing more. Then reclaims space (incremental vacuum, and
    a truncating checkpoint of SQLite's own WAL, also when it deleted nothing; a plain VACUUM,
    without ANALYZE, on PostgreSQL).
    On PostgreSQL it also merges the recorders' stats_rollup shards of the days and hours that
    are over (`rollup.merge_shards`), whether or not it deleted anything (not on a dry run).
    """
    if older_than_s < 0:
        raise InvalidInputError(f"older_than must not be negative, got {older_than_s}")
    if batch_traces <= 0:
        raise InvalidInputError(f"batch_traces must be positive, got {batch_traces}")
    cutoff = now_ns - int(older_than_s * 1e9)
    files = _db_files(engine)
    if dry_run:
        before = 0
        progress = None  # a dry run shows no bar, as it never has
    else:
        before = _size(files) if engine.dialect.name == "sqlite" else _pg_size(engine)
    if engine.dialect.name == "postgresql":
        _analyze_if_unknown(engine)
    estimate = _estimate(engine, cutoff) if progress is not None else 0
    deleted = steps = pinned = parents = batches = 0
    # (created_at_ns, execution_id) < (cutoff, ""): exactly the traces created before the cutoff.
    after: tuple[int, str] = (cutoff, "")
    with _walk_connection(engine) as conn:
        with conn.begin():
            keep_rollup = rollup.present(conn)
        while True:
            b = _batch(conn, cutoff, after, batch_traces, dry_run, outside_parents, keep_rollup)
            deleted += b.deleted
            steps += b.steps
            pinned += b.pinned
            parents += b.parents
            if b.deleted and not dry_run:
                batches += 1
            if progress is not None and deleted and (b.deleted or b.last is None):
                progress(deleted, max(estimate - parents, deleted))
            if b.last is None:
                break
            after = b.last
        if engine.dialect.name == "sqlite" and not dry_run:
            # Also when nothing was deleted: an earlier prune's checkpoint a reader held back
            # left SQLite's WAL file long; this one cuts it. On the walk's connection: its
            # checkpoint interval too.
            _reclaim(conn)
    if dry_run:
        return PruneResult(deleted, steps, pinned, parents, 0, 0, True)
    if engine.dialect.name == "postgresql" and keep_rollup:
        _merge_rollup_shards(engine, now_ns)
    freed = 0
    if engine.dialect.name == "sqlite" and deleted:
        freed = max(0, before - _size(files))
    elif engine.dialect.name == "postgresql" and deleted:
        _vacuum_pg(engine)
        freed = max(0, before - _pg_size(engine))
    return PruneResult(deleted, steps, pinned, parents, batches, freed, False)


def _merge_rollup_shards(engine: Engine, now_ns: int) -> None:
    """PostgreSQL: stats_rollup's shards of the days and hours over an hour ago, one row a key
    and bucket (`rollup.merge_shards`): what `stats` by hour over all time reads. Each prune does
    it, whether or not it deleted anything."""
    with engine.begin() as conn:
        rollup.merge_shards(conn, now_ns - rollup.HOUR_NS)


def _analyze_if_unknown(engine: Engine) -> None:
    """ANALYZE those of the two tables whose row count the planner does not know (never analyzed
    nor vacuumed: a database loaded minutes ago, before autovacuum came by). Without it, each
    batch deletes its steps with a sequential scan of `trace_steps` (0.26 s instead of 0.02 s a
    batch of 500 traces on 1M steps). ANALYZE blocks no reader or writer."""
    with engine.connect() as conn:
        unknown = conn.exec_driver_sql(
            "SELECT relname FROM pg_class WHERE oid IN ('traces'::regclass, 'trace_steps'::regclass) "
            "AND reltuples < 0 ORDER BY relname"
        ).scalars().all()
        conn.rollback()
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        for name in unknown:
            auto.exec_driver_sql(f"ANALYZE {name}")


def _pg_size(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT pg_total_relation_size('traces') + pg_total_relation_size('trace_steps')"
            ).scalar()
        )


def _vacuum_pg(engine: Engine) -> None:
    """A plain VACUUM: makes the deleted rows' space reusable and truncates empty trailing pages.
    It takes no lock that blocks the recorders' reads or writes.

    Without ANALYZE: sampling the two tables took four times as long as the VACUUM itself (a
    store of 1M steps, a tenth pruned), and autovacuum analyzes a table anyway once a tenth of
    its rows changed (autovacuum_analyze_scale_factor)."""
    with engine.connect() as conn:
        # VACUUM cannot run inside a transaction block.
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        auto.exec_driver_sql("VACUUM trace_steps, traces")


VACUUM_PAGES_PER_STEP = 2048
# How long prune's closing checkpoint waits for readers (`_reclaim`).
CHECKPOINT_WAIT_MS = 200


def _reclaim(conn) -> None:
    """Give freed pages back to the file system, a bounded number of pages per write lock, and
    make the walk durable (it committed without fsync: `_WALK_PRAGMAS`)."""
    raw = conn.connection.driver_connection
    while raw.execute("PRAGMA freelist_count").fetchone()[0] > 0:
        # executescript steps the pragma to completion; a plain execute frees one page.
        raw.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES_PER_STEP});")
    # Move SQLite's own WAL into the file and cut it to zero bytes: the checkpoint syncs the WAL
    # before it copies pages, and the file after. While it waits for a reader to move on it
    # holds every writer off, the recorder's compactor too: it waits CHECKPOINT_WAIT_MS at most
    # (the WAL is then cut by a later prune).
    timeout = raw.execute("PRAGMA busy_timeout").fetchone()[0]
    raw.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}").fetchall()
    try:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        raw.execute(f"PRAGMA busy_timeout={int(timeout)}").fetchall()
    # A reader's snapshot can hold the checkpoint back: then what is left in the WAL is synced
    # here, the walk's commits with it.
    wal_file = _db_files(conn.engine)[1]
    try:
        fd = os.open(wal_file, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        if os.fstat(fd).st_size:
            os.fsync(fd)
    finally:
        os.close(fd)


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


class UncompactedForks:
    """The parents of the forks started in this data directory's WAL above the applied LSN, read
    without the recorder's lock (it may be running). Each call reads on from where the last one
    stopped, so a prune batch asks again cheaply just before it deletes."""

    def __init__(self, wal_dir: str, applied_lsn: int):
        self.wal_dir = wal_dir
        self.next_lsn = applied_lsn + 1
        self.parents: set = set()

    def __call__(self) -> set:
        if not os.path.isdir(self.wal_dir):
            return self.parents
        reader = wal.WalReader(self.wal_dir, from_lsn=self.next_lsn, mode="point_in_time")
        for rec in reader.records():
            self.next_lsn = rec.lsn + 1
            parent = fork_parent(rec.payload)
            if parent:
                self.parents.add(parent)
        return self.parents
