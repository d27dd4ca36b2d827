"""Folds committed WAL records into `traces` and `trace_steps`.

Each batch (thousands of records) is one transaction: new traces inserted, touched traces updated,
steps inserted, each with one executemany, and the checkpoint's applied LSN moved in the same
transaction. A crash anywhere leaves either the whole batch with its LSN or none of it, so a record
is applied exactly once. Only after the commit is durable (synchronous=FULL) may WAL segments below
the applied LSN be deleted.

The records are written by `tracedb.recorder.store` in the format `tracedb.records.codec` defines. An event's payload
goes into `trace_steps` as the JSON text the recorder serialised, never decoded and encoded again,
with the CRC32C of those bytes beside it; the checked columns of `traces` get theirs likewise
(`tracedb.projection.checksums`).

An operator may invalidate a trace directly in the database while a recorder runs (`tracedb
invalidate`); every status change below is therefore guarded so that it never overwrites
`invalidated`, and a reason is never replaced by a weaker one (`codec.transition`): a later finish
never makes a trace flagged `recording_failure` replayable again, nor does marking it incomplete
take its `recording_failure` and note away.

Many recorders may compact into one PostgreSQL database at once. Each has its own checkpoint row
(keyed by recorder_id) and writes only traces it started, so their transactions touch disjoint
rows. A recorder never adds steps to, or marks incomplete, a trace another recorder owns (an
execution id both used): those UPDATEs are guarded by recorder_id, a shortfall in their row count
sends the batch down the record-by-record path, and the foreign records are skipped and counted.
Invalidation and recording_failure may cross recorders (any recorder may be asked to invalidate
any execution the database holds).

An execution id is started again only after `prune` deleted its trace: the recorder refuses a
start of any id it holds in memory or the database holds. So a start record of an id whose trace
this recorder's records already made (in the database or in the same batch) is met only when the
WAL is applied again from below (`tracedb recover --rebuild`, a database restored from a backup):
the newer start replaces the earlier execution, its row and steps, as prune had deleted them. A
start of an id another recorder owns is skipped, as its other records are.

A server connection can drop at any moment, also while COMMIT is in flight, when nobody can tell
whether the batch committed. After any failure the compactor therefore reads its checkpoint back
from the database before it applies anything else, and resumes from there; on a server database
it reconnects and retries once by itself.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import operator
import time
from dataclasses import dataclass
from typing import Callable, Optional

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import wal
from wal.format import crc32c

from tracedb.projection import db, rollup
from tracedb.records import outcomes
from tracedb.projection.checksums import TRACE_VALUE_COLUMNS, crc_column
from tracedb.errors import IntegrityError
from tracedb.records.fold import STEP_COLUMNS, STEP_WIDTH, Fold, steps_of
from tracedb.projection.models import compaction_checkpoint, trace_steps, traces
from tracedb.records.record import REASON_RANK, STATUS_INCOMPLETE, STATUS_INVALIDATED
from tracedb.projection.schema import TRACES

log = logging.getLogger(__name__)

# A hook called as hook(point, batch) at two points of every batch (batch counted from 1):
# before_commit (inside the transaction, rows written) and after_commit (committed, before the
# WAL is told). None in production. Crash tests install one (tests/pause_launcher.py) that
# blocks at a chosen point so that they can SIGKILL a real process at a known place; a
# Compactor takes its own with `pause=`, else the one set here when it was made.
PauseHook = Callable[[str, int], None]
pause_hook: Optional[PauseHook] = None


@dataclass(frozen=True)
class CompactResult:
    """What one `compact()` call applied."""

    records: int = 0
    steps: int = 0
    traces_created: int = 0
    traces_updated: int = 0
    batches: int = 0
    skipped_records: int = 0
    applied_lsn: int = 0
    segments_deleted: int = 0
    seconds: float = 0.0
    # Times the database connection was lost and compaction resumed on a new one.
    reconnects: int = 0

    @property
    def events_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


def _dumps(value) -> str:
    return orjson.dumps(value).decode()


def _dumps_or_none(value) -> Optional[str]:
    return None if value is None else orjson.dumps(value).decode()


def _checked_json(value) -> tuple[Optional[str], int]:
    """A checked value column's JSON text (None for SQL NULL) and its checksum (tracedb.projection.checksums)."""
    if value is None:
        return None, 0
    data = orjson.dumps(value)
    return data.decode(), crc32c(data)


_FIRST = operator.itemgetter(0)  # a trace row's execution id (schema.TRACES), as a step row's (TRACE_STEPS)
_GREATEST_STEP_ID = "SELECT max(execution_id) FROM trace_steps"


def _lands_inside(conn, steps: list) -> bool:
    """Whether most executions of a batch's steps (laid end to end, as `Fold.steps`) have ids
    below the greatest one `trace_steps` holds. Their rows then go into the middle of the
    primary keys' indexes, not onto their end, and inserted in log order (executions
    interleaved) each lands on a page of its own, which SQLite's small page cache has mostly
    let go: a caller's uuid4 ids do so. Ids that grow with time, as the store's own do
    (UUIDv7), land near the end whatever the order, and sorting would only cost."""
    top = conn.exec_driver_sql(_GREATEST_STEP_ID).scalar()
    if top is None:
        return False
    ids = dict.fromkeys(steps[0::STEP_WIDTH])
    below = sum(1 for eid in ids if eid < top)
    return below * 2 > len(ids)


def _in_key_order(steps: list) -> tuple:
    """Step rows laid end to end, ordered by execution id; one execution's rows stay in the
    order given (its seq order: the sort is stable). A tuple: the insert takes it as it is."""
    order = sorted(range(0, len(steps), STEP_WIDTH), key=steps.__getitem__)
    return tuple(itertools.chain.from_iterable([steps[i : i + STEP_WIDTH] for i in order]))


class _Raw:
    """A statement compiled once for the engine's dialect and run through the DBAPI's executemany.

    Skipping SQLAlchemy's per-row parameter processing is what keeps compaction close to a raw
    executemany; JSON values are serialised by orjson before they get here. Rows are tuples in
    the order of `keys`.
    """

    def __init__(self, engine: Engine, stmt, keys: tuple[str, ...], *, flat: bool = False, **compile_kw):
        """`flat`: `execute` gets the rows' values end to end instead of a list of tuples."""
        self.flat = flat
        compiled = stmt.compile(dialect=engine.dialect, **compile_kw)
        self.sql = str(compiled)
        self.positional = compiled.positional
        names = list(compiled.positiontup) if compiled.positional else list(compiled.params)
        index = {k: i for i, k in enumerate(keys)}
        self.order = [index[n] for n in names]
        self.names = names
        self.identity = self.order == list(range(len(keys)))

    def execute(self, conn, rows: list[tuple]) -> int:
        if not rows:
            return 0
        if self.flat:
            rows = steps_of(rows)
        if self.positional:
            params = rows if self.identity else [tuple([r[i] for i in self.order]) for r in rows]
        else:
            params = [dict(zip(self.names, [r[i] for i in self.order])) for r in rows]
        return conn.exec_driver_sql(self.sql, params).rowcount


class _SqliteMultiRow:
    """Rows into SQLite as `INSERT ... VALUES (...), (...), ...` of `per` rows a statement.

    SQLite runs one statement step (and the DBAPI one bind-and-reset round) per statement, not
    per row: 50 rows a statement inserts about 1.3x faster than executemany of one row each.
    The rows stay in order and in the caller's transaction; errors come wrapped by SQLAlchemy
    exactly as executemany's do.
    """

    def __init__(self, table: sa.Table, keys: tuple[str, ...], per: int = 50):
        one = "(" + ", ".join("?" * len(keys)) + ")"
        head = f"INSERT INTO {table.name} ({', '.join(keys)}) VALUES "
        self.sql_many = head + ", ".join([one] * per)
        self.sql_one = head + one
        self.per = per
        self.row_width = len(keys)
        self.width = len(keys) * per

    def execute(self, conn, flat: list) -> int:
        """Insert rows given end to end (`width` values a row)."""
        values = tuple(flat)
        n = len(values) // self.row_width
        w = self.width
        full = (n - n % self.per) * self.row_width
        if full:
            conn.exec_driver_sql(self.sql_many, [values[i : i + w] for i in range(0, full, w)])
        if full < len(values):
            conn.exec_driver_sql(self.sql_one, steps_of(values[full:], self.row_width))
        return n


class _PgCopy:
    """Steps into PostgreSQL with COPY instead of executemany: several times faster, and the
    same transaction, so the checkpoint still commits with the rows. Driver errors are raised
    as SQLAlchemy's (IntegrityError, OperationalError, ...) so that the compactor handles them
    exactly as it handles executemany's."""

    def __init__(self, table: sa.Table, keys: tuple[str, ...]):
        self.sql = f"COPY {table.name} ({', '.join(keys)}) FROM STDIN"
        self.width = len(keys)

    def execute(self, conn, flat: list) -> int:
        """Copy rows given end to end."""
        if not flat:
            return 0
        import psycopg

        raw = conn.connection.driver_connection
        w = self.width
        try:
            with raw.cursor() as cur, cur.copy(self.sql) as copy:
                for i in range(0, len(flat), w):
                    copy.write_row(flat[i : i + w])
        except psycopg.Error as e:
            raise sa.exc.DBAPIError.instance(self.sql, None, e, psycopg.Error) from e
        return len(flat) // w


def _pg_text(value):
    # PostgreSQL text cannot hold NUL; SQLite can. A NUL in an intent or a reason would make the
    # batch fail on every retry and stop the recorder's compaction for good, so it is replaced.
    if value is not None and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def _same(value):
    return value


class _RowsNotOwned(IntegrityError):
    """A guarded UPDATE missed rows: the trace is gone (pruned) or another recorder owns it."""


class Compactor:
    """Applies a recorder's WAL to the database, incrementally, from its checkpoint.

    Not thread-safe by itself: the store serialises calls with its compaction lock.
    """

    def __init__(
        self,
        engine: Engine,
        wal_dir: str,
        recorder_id: str,
        applied_lsn: int,
        *,
        batch_records: int = 5000,
        clock: Callable[[], int] = time.time_ns,
        source: Optional[Callable[[int, int, int], Optional[list]]] = None,
        pause: Optional[PauseHook] = None,
    ):
        """`source(first_lsn, max_records, to_lsn)`, when given, is asked first for the records
        to apply, as (lsn, payload, hint) (`wal.Wal.take_retained`: what the recorder in this
        process has just appended, still in memory); when it answers None the compactor reads
        the WAL segments. An event's hint, its `codec.EventFrame`, saves splitting its record's
        frame; it must say what the record says."""
        self.engine = engine
        self.source = source
        self.wal_dir = wal_dir
        self.recorder_id = recorder_id
        self.applied_lsn = applied_lsn
        self.batch_records = batch_records
        self.clock = clock
        self._reader: Optional[wal.WalReader] = None
        # The segment reader's generator, one per compact() call that reads the segments: once
        # a call reads them it goes on reading them (it does not go back to `source`).
        self._gen = None
        self._conn = None
        self._data_version: Optional[int] = None
        self._batches_total = 0
        self._pause_hook = pause if pause is not None else pause_hook
        self._server = engine.dialect.name != "sqlite"
        self._text = _pg_text if engine.dialect.name == "postgresql" else _same
        # Set after any failure: the in-memory applied LSN may be behind the database (a COMMIT
        # whose answer was lost); read it back before applying anything.
        self._resync = False
        if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
            self._insert_steps = _PgCopy(trace_steps, STEP_COLUMNS)
        elif engine.dialect.name == "sqlite":
            self._insert_steps = _SqliteMultiRow(trace_steps, STEP_COLUMNS)
        else:
            self._insert_steps = _Raw(
                engine, trace_steps.insert(), STEP_COLUMNS, flat=True, column_keys=list(STEP_COLUMNS)
            )
        self._insert_traces = _Raw(engine, traces.insert(), TRACES, column_keys=list(TRACES))
        # SQLite: a batch whose executions' ids land inside the indexes is inserted in id order
        # (on PostgreSQL, measured, sorting before COPY only cost: docs/benchmarks.md).
        self._key_order = engine.dialect.name == "sqlite"
        self._updates: dict = {}
        # Whether this database keeps stats_rollup by batch (SQLite since migration 0008,
        # PostgreSQL since 0009); known at the first batch.
        self._rollup: Optional[bool] = None
        cp = compaction_checkpoint
        self._checkpoint = (
            sa.update(cp)
            .where(cp.c.recorder_id == sa.bindparam("b_recorder"))
            .where(cp.c.applied_lsn == sa.bindparam("b_old"))
            .values(applied_lsn=sa.bindparam("b_new"), updated_at_ns=sa.bindparam("b_t"))
        )

    # -- connection ----------------------------------------------------------------------
    def _connection(self):
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    def close(self, *, broken: bool = False) -> None:
        """Release the compactor's database connection (`broken`: discard it, the server side
        is gone, instead of handing it back to the pool)."""
        if self._conn is not None:
            try:
                if broken:
                    self._conn.invalidate()
                self._conn.close()
            finally:
                self._conn = None

    def external_change(self) -> bool:
        """True if another connection committed since the last call (SQLite's data_version).

        The store uses it to notice `tracedb invalidate` run next to it. Other dialects: always True.
        """
        if self.engine.dialect.name != "sqlite":
            return True
        conn = self._connection()
        version = conn.exec_driver_sql("PRAGMA data_version").scalar()
        if conn.in_transaction():
            conn.rollback()
        changed = self._data_version is not None and version != self._data_version
        self._data_version = version
        return changed

    # -- the main loop -------------------------------------------------------------------
    def compact(
        self,
        to_lsn: int,
        *,
        mark_applied: Optional[Callable[[int], int]] = None,
        progress: Optional[Callable[[int, int], None]] = None,
        on_batch: Optional[Callable[[int], None]] = None,
    ) -> CompactResult:
        """Apply every record with applied_lsn < lsn <= to_lsn, in batches.

        `to_lsn` must be durable (the writer's durable_lsn): unacknowledged bytes are never read.
        `mark_applied(lsn)` is called after a durable commit when WAL segments can be deleted.
        """
        t0 = time.perf_counter()
        total = max(0, to_lsn - self.applied_lsn)
        done = records = steps = created = updated = batches = skipped = deleted = 0
        reconnects = 0
        failed_in_a_row = 0  # connection losses since the last batch that committed
        while self.applied_lsn < to_lsn:
            try:
                if self._resync:
                    if self._resync_checkpoint() and on_batch is not None:
                        on_batch(self.applied_lsn)
                    if self.applied_lsn >= to_lsn:
                        break
                recs = None
                if self._gen is None and self.source is not None:
                    recs = self.source(self.applied_lsn + 1, self.batch_records, to_lsn)
                if recs is not None:
                    if not recs:
                        break
                    # The segment reader (if any) is behind now: start a new one when needed.
                    self._reader = None
                    counts = self._apply(recs, True)
                else:
                    counts = self._apply_from_segments(to_lsn)
                    if counts is None:
                        break
            except BaseException as e:
                # The reader may have moved past records that were not applied: start again
                # from the checkpoint next time, read back from the database.
                self._close_gen()
                self._reader = None
                self._resync = True
                lost = isinstance(e, Exception) and db.is_disconnect(e)
                self.close(broken=lost)
                transient = isinstance(e, sa.exc.DBAPIError) and db.sqlstate(e) in db.RETRY_SQLSTATES
                if self._server and (lost or transient):
                    # Once per failure: a second one before any batch commits means the server
                    # is really gone (or the lock really held): report it; the caller retries.
                    if failed_in_a_row == 0:
                        failed_in_a_row += 1
                        reconnects += lost
                        log.warning(
                            "compaction %s on %s (%s); resuming from the checkpoint",
                            "lost its connection" if lost else "must run a batch again",
                            db.describe(self.engine.url), db.first_line(e),
                        )
                        continue
                    if lost:
                        raise db.unavailable(self.engine, e) from e
                raise
            failed_in_a_row = 0
            n, s, c, u, k = counts
            records += n
            steps += s
            created += c
            updated += u
            skipped += k
            batches += 1
            done += n
            if on_batch is not None:
                on_batch(self.applied_lsn)
            if mark_applied is not None:
                deleted += self.release_wal(mark_applied)
            if progress is not None:
                progress(done, total)
        self._close_gen()
        return CompactResult(
            records, steps, created, updated, batches, skipped, self.applied_lsn, deleted,
            time.perf_counter() - t0, reconnects,
        )

    def _apply_from_segments(self, to_lsn: int):
        """Apply the next batch read from the WAL segments; None when there is none."""
        if self._reader is None:
            self._reader = wal.WalReader(self.wal_dir, from_lsn=self.applied_lsn + 1)
        if self._gen is None:
            # One pass over the log for the whole call: each call of the reader reads the rest
            # of its segment piece anew, so calling it per batch would read it many times.
            self._gen = self._reader.batches(self.batch_records, to_lsn)
        applied = self.applied_lsn
        for batch in self._gen:
            recs = [r for r in batch if r.lsn > applied]
            if recs:
                return self._apply(recs, False)
        return None

    def _close_gen(self) -> None:
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    def _resync_checkpoint(self) -> bool:
        """Adopt the applied LSN the database holds; True if it was ahead of this compactor."""
        cp = compaction_checkpoint
        with self._connection().begin():
            stored = self._connection().execute(
                sa.select(cp.c.applied_lsn).where(cp.c.recorder_id == self.recorder_id)
            ).scalar()
        self._resync = False
        if stored is None or stored < self.applied_lsn:
            raise IntegrityError(
                f"the compaction checkpoint of recorder {self.recorder_id!r} is "
                f"{'gone' if stored is None else f'at LSN {stored}'}, behind the {self.applied_lsn} "
                "this compactor applied",
                hint="something else rewrote compaction_checkpoint; restore the database, or give "
                "this data directory a new recorder_id and let it compact its whole WAL again",
            )
        if stored > self.applied_lsn:
            log.warning(
                "the batch up to LSN %d committed although its connection failed; resuming after it",
                stored,
            )
            self.applied_lsn = stored
            return True
        return False

    def adopt(self, applied_lsn: int) -> None:
        """Take the applied LSN reached by another compactor of this recorder (the store's child
        process); the next in-process compaction reads the WAL from there."""
        self.applied_lsn = applied_lsn
        self._reader = None

    def release_wal(self, mark_applied: Callable[[int], int]) -> int:
        """Let the WAL delete the segments wholly applied; returns how many it deleted."""
        # mark_applied writes and fsyncs the APPLIED file: call it only when a sealed segment
        # lies wholly below the applied LSN and can actually be deleted.
        nxt_lsn = self.applied_lsn + 1
        segs = wal.list_segments(self.wal_dir)
        if any(b.first_lsn <= nxt_lsn for b in segs[1:]):
            return mark_applied(nxt_lsn)
        return 0

    def _pause(self, point: str) -> None:
        if self._pause_hook is not None:
            self._pause_hook(point, self._batches_total)

    # -- one batch -----------------------------------------------------------------------
    def _apply(self, recs, hinted: bool) -> tuple[int, int, int, int, int]:
        """Apply one batch: `recs` are wal Records, or (lsn, payload, hint) when `hinted`."""
        with _collector_paused():
            return self._apply_batch(recs, hinted)

    def _apply_batch(self, recs, hinted: bool) -> tuple[int, int, int, int, int]:
        f = Fold(self.recorder_id)
        f.add(recs, hinted)
        f.end()
        for eid, lsn in f.restarted.items():
            _log_restart(lsn, eid)
        for lsn in f.bad_decisions:
            # The store refuses payloads that are not JSON (an orjson.Fragment); a WAL written
            # before it did may hold one: it must not stop compaction.
            log.error("WAL record %d: ROUTER_DECISION payload is not JSON; not kept", lsn)
        new, upd, steps = f.new, f.upd, f.steps
        self._batches_total += 1
        try:
            self._write(new, upd, steps, recs[-1][0])
            skipped = 0
        except (sa.exc.IntegrityError, _RowsNotOwned) as e:
            # A step whose trace was pruned meanwhile (it had been invalidated from the CLI), a
            # row that already exists, or an execution id another recorder owns: keep the
            # compactor moving, apply what fits, say so.
            log.warning(
                "compaction batch up to LSN %d hit %s; applying it record by record",
                recs[-1][0], getattr(e, "orig", None) or e,
            )
            skipped = self._write_filtered(new, upd, steps, recs[-1][0], f.starts)
        return len(recs), f.step_count(), len(new), len(upd), skipped

    def _write(self, new: dict, upd: dict, steps: list, last_lsn: int, replace: frozenset = frozenset()) -> None:
        """Commit one batch: `steps` is flat (see `_apply`), the checkpoint moves with it.
        `replace`: ids of this recorder's traces deleted first (started again, module doc)."""
        conn = self._connection()
        with conn.begin():
            if replace:
                conn.execute(
                    sa.delete(traces).where(traces.c.execution_id.in_(sorted(replace)))
                    .where(traces.c.recorder_id == self.recorder_id)
                )
            if self._rollup is None:
                self._rollup = rollup.present(conn)
            with rollup.deferred(conn, self._rollup) as delta:
                held = None
                if delta is not None:
                    # What the rows to change hold now, taken away; what they hold after, added.
                    held = rollup.read(conn, sorted(upd)) if upd else {}
                    for row in held.values():
                        delta.add_stored(row, -1)
                    for r in new.values():
                        delta.add(r["intent"], r["outcome"], r["models"], r["input_tokens"], r["output_tokens"],
                                  r["cost_usd"], r["created_at_ns"], r["last_event_ns"], self.recorder_id)
                keyed = self._key_order and bool(steps) and _lands_inside(conn, steps)
                if new:
                    rows = [self._trace_tuple(r) for r in new.values()]
                    if keyed:
                        rows.sort(key=_FIRST)  # by execution id
                    self._insert_traces.execute(conn, rows)
                if upd:
                    self._run_updates(conn, upd, held)
                self._insert_steps.execute(conn, _in_key_order(steps) if keyed else steps)
                if delta is not None:
                    # Read back what is or was finished: a row that was running and that this
                    # batch gave no outcome is running still, and contributes nothing.
                    again = [eid for eid, row in held.items()
                             if row[1] not in (None, outcomes.RUNNING) or "outcome" in upd[eid]]
                    for row in rollup.read(conn, sorted(again)).values():
                        delta.add_stored(row)
            res = conn.execute(
                self._checkpoint,
                {"b_recorder": self.recorder_id, "b_old": self.applied_lsn, "b_new": last_lsn, "b_t": self.clock()},
            )
            if res.rowcount != 1:
                raise IntegrityError(
                    f"the compaction checkpoint of recorder {self.recorder_id!r} moved under this "
                    f"compactor (expected applied LSN {self.applied_lsn})",
                    hint="two processes compact the same recorder's WAL: give each data directory "
                    "its own recorder_id",
                )
            self._pause("before_commit")
        # Before the in-memory LSN moves: a fault injected here is a COMMIT whose answer was lost.
        self._pause("after_commit")
        self.applied_lsn = last_lsn

    def _write_filtered(self, new: dict, upd: dict, steps: list, last_lsn: int, starts: dict) -> int:
        """`_write` of what this recorder may apply: the database read for who owns which id."""
        conn = self._connection()
        rows = steps_of(steps)
        ids = list({*new, *upd, *(s[0] for s in rows)})
        owner: dict = {}
        have_steps: set = set()
        with conn.begin():
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                owner.update(
                    conn.execute(
                        sa.select(traces.c.execution_id, traces.c.recorder_id).where(
                            traces.c.execution_id.in_(chunk)
                        )
                    ).all()
                )
                have_steps.update(
                    (r[0], r[1])
                    for r in conn.execute(
                        sa.select(trace_steps.c.execution_id, trace_steps.c.seq).where(
                            trace_steps.c.execution_id.in_(chunk)
                        )
                    )
                )
        existing = {eid for eid, rid in owner.items() if rid == self.recorder_id}
        replaced = frozenset(existing.intersection(new))
        skipped = 0
        kept_new = {}
        for eid, row in new.items():
            if eid in replaced:
                _log_restart(starts[eid], eid)
            elif eid in owner:
                skipped += 1
                log.error(
                    "WAL LSN %d starts execution %r, which recorder %r recorded already: this "
                    "recorder's records of it are skipped (execution ids must be unique across "
                    "a fleet)", starts[eid], eid, owner[eid],
                )
                continue
            kept_new[eid] = row
        kept_steps: list = []
        for s in rows:
            if (s[0] in kept_new or s[0] in existing) and (s[0] in replaced or (s[0], s[1]) not in have_steps):
                kept_steps += s
            else:
                skipped += 1
        kept_upd = {
            eid: row for eid, row in upd.items()
            if eid in existing or (eid in owner and not _owner_only(row))
        }
        self._write(kept_new, kept_upd, kept_steps, last_lsn, replaced)
        return skipped

    def _trace_tuple(self, r: dict) -> tuple:
        """A new row's values in the order of `schema.TRACES`, each stored value as written:
        JSON serialised, a checked value with its checksum, text made storable."""
        values = list(_TRACE_VALUES(r))
        for i, j in _CHECKED_AT:
            v = values[i]
            if v is not None:
                data = orjson.dumps(v)
                values[i] = data.decode()
                values[j] = crc32c(data)
            else:
                values[j] = 0
        for i in _DUMPED_AT:
            values[i] = orjson.dumps(values[i]).decode()
        if self._text is not _same:
            for i in _TEXT_AT:
                values[i] = self._text(values[i])
        return tuple(values)

    def _update_values(self, delta: dict) -> dict:
        """The columns an UPDATE sets for a pending change: JSON serialised, a checked value
        column with its checksum beside it."""
        out = {}
        for k, v in delta.items():
            if k in _CHECKED_COLS:
                out[k], out[crc_column(k)] = _checked_json(v)
            elif k in _JSON_COLS:
                out[k] = _dumps_or_none(v)
            elif k in _TEXT_COLS:
                out[k] = self._text(v)
            else:
                out[k] = v
        return out

    def _run_updates(self, conn, upd: dict, held: Optional[dict] = None) -> None:
        """`held`: the rows' rollup columns (`rollup.read`), read already, else None."""
        _merge_models(conn, upd, held)
        groups: dict[tuple, list] = {}
        # In execution-id order: every writer locks trace rows in the same order, so two
        # compactors (or a compactor and prune) cannot deadlock on them.
        for eid in sorted(upd):
            delta = self._update_values(upd[eid])
            keys = tuple(sorted(delta))
            row = [delta[k] for k in keys]
            row.append(eid)
            owned = _owner_only(delta)
            if owned:
                row.append(self.recorder_id)
            groups.setdefault((keys, owned), []).append(row)
        for (keys, owned), rows in groups.items():
            raw = self._updates.get((keys, owned))
            if raw is None:
                names = tuple("b_" + k for k in keys) + ("b_id",) + (("b_recorder",) if owned else ())
                raw = self._updates[(keys, owned)] = _Raw(self.engine, _update_statement(keys, owned), names)
            n = raw.execute(conn, [tuple(r) for r in rows])
            if owned and n != len(rows):
                raise _RowsNotOwned(
                    f"{len(rows) - n} of {len(rows)} traces to update are gone or owned by another recorder"
                )


_JSON_COLS = frozenset({"router_decision", "final_response", "envelope", "models"})
_CHECKED_COLS = frozenset(TRACE_VALUE_COLUMNS)
_TEXT_COLS = ("intent", "status_note", "error_code", "error_message")  # free text, made storable (`_text`)
# `_trace_tuple`: a row's values in `TRACES` order (a fold's row has no checksum columns: in their
# places the checked value itself, replaced by its checksum), and where in that order the checked
# columns (with their checksum's place), JSON and free text are.
_CRC_OF = {crc_column(k): k for k in TRACE_VALUE_COLUMNS}
_TRACE_VALUES = operator.itemgetter(*(_CRC_OF.get(c, c) for c in TRACES))
_CHECKED_AT = tuple((TRACES.index(k), TRACES.index(crc_column(k))) for k in TRACE_VALUE_COLUMNS)
_DUMPED_AT = tuple(TRACES.index(k) for k in ("envelope", "models"))
_TEXT_AT = tuple(TRACES.index(k) for k in _TEXT_COLS)


@contextlib.contextmanager
def _collector_paused():
    """No cyclic garbage collection during one batch.

    A batch makes tens of thousands of container objects (rows, frames, tuples) and frees them
    all when it ends, none in a cycle; with the collector on, the young generation is collected
    every 700 of them and the whole heap now and then, about a tenth of a batch's time. Cycles
    other threads make meanwhile are collected after the batch. A collector that was off (the
    application's choice) stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _log_restart(lsn: int, eid: str) -> None:
    log.warning(
        "WAL LSN %d starts execution %r again: its earlier execution (deleted by prune before the id "
        "was used again) is replaced", lsn, eid,
    )


def _merge_models(conn, upd: dict, held: Optional[dict] = None) -> None:
    """Make each change's `models` (the names this batch saw) the whole list: the row's, then
    the new names. A JSON list cannot be extended in SQL alike on SQLite and PostgreSQL, so the
    rows that need it are read, in the transaction that writes them, unless `held` has them
    (`rollup.read`'s rows: their models third)."""
    ids = sorted(eid for eid, delta in upd.items() if delta.get("models"))
    if held is not None:
        stored_models = [(eid, rollup.models_of(held[eid][2])) for eid in ids if eid in held]
    else:
        stored_models = []
        for i in range(0, len(ids), 500):
            stored_models += conn.execute(
                sa.select(traces.c.execution_id, traces.c.models).where(traces.c.execution_id.in_(ids[i : i + 500]))
            ).all()
    for eid, stored in stored_models:
        stored = list(stored or ())
        upd[eid]["models"] = stored + [m for m in upd[eid]["models"] if m not in stored]
    for delta in upd.values():
        if "models" in delta and not delta["models"]:
            del delta["models"]  # nothing new: leave the row's list as it is


def _owner_only(delta: dict) -> bool:
    """True for a change only the recorder that owns the trace may make: new steps (they move
    last_seq) or marking it incomplete. Invalidation and recording_failure may come from any."""
    return "last_seq" in delta or delta.get("status") == STATUS_INCOMPLETE


def _first_error(k: str):
    return lambda c, p: sa.case((c.error_seq.is_(None), p), else_=c[k])


def _closed_outcome(c, p):
    # `incomplete` closes only an execution that has not finished (tracedb.records.outcomes.fold_closed).
    done = c.outcome.in_([sa.literal_column(f"'{outcomes.SUCCEEDED}'"), sa.literal_column(f"'{outcomes.FAILED}'")])
    return sa.case((sa.and_(p == sa.literal_column(f"'{outcomes.INCOMPLETE}'"), done), c.outcome), else_=p)


# How a change of an existing row sets the derived columns (tracedb.records.outcomes): tokens and cost
# are what the batch added (a NULL cost, unknown, stays NULL), the first error is kept.
_DERIVED_SQL = {
    "input_tokens": lambda c, p: sa.func.coalesce(c.input_tokens, sa.literal_column("0")) + p,
    "output_tokens": lambda c, p: sa.func.coalesce(c.output_tokens, sa.literal_column("0")) + p,
    "cost_usd": lambda c, p: c.cost_usd + p,
    "outcome": _closed_outcome,
    **{k: _first_error(k) for k in ("error_seq", "error_type", "error_code", "error_message")},
}


def _reason_rank(expr) -> sa.Case:
    """`record.REASON_RANK` of a reason, in SQL (constants inline, see `_update_statement`)."""
    whens = [
        (expr == sa.literal_column(f"'{reason}'"), sa.literal_column(str(rank)))
        for reason, rank in REASON_RANK.items() if reason is not None
    ]
    return sa.case(*whens, else_=sa.literal_column("0"))


def _update_statement(keys: tuple, owned: bool = False) -> sa.Update:
    """UPDATE traces for one set of changed columns, with the lifecycle guards (module doc);
    `owned` adds `recorder_id = :b_recorder` (see `_owner_only`).

    The delta was folded by `codec.transition` as if the row were running and unflagged; the
    statement applies the same rule to the row it finds: an invalidated row keeps everything, and
    a row whose reason is stronger than the delta's keeps its reason, replayable and note."""
    c = traces.c
    # Constants inline, so that every bound parameter is one of the row's values.
    invalidated = c.status == sa.literal_column(f"'{STATUS_INVALIDATED}'")
    values: dict = {}
    for k in keys:
        # JSON arrives serialised already (the DBAPI gets it as is, see _Raw); binding it with the
        # column's type makes PostgreSQL cast the text to json instead of refusing varchar.
        p = sa.bindparam("b_" + k, type_=traces.c[k].type)
        if k == "status":
            values[k] = sa.case((invalidated, c.status), else_=p)
        elif k in _DERIVED_SQL:
            values[k] = _DERIVED_SQL[k](c, p)
        elif k in ("replayable", "replayable_reason", "status_note"):
            # `transition` sets these three together with the reason (a finish: no note).
            reason = sa.bindparam("b_replayable_reason", type_=traces.c.replayable_reason.type)
            stronger = _reason_rank(c.replayable_reason) > _reason_rank(reason)
            values[k] = sa.case((invalidated, c[k]), (stronger, c[k]), else_=p)
        else:
            values[k] = p
    stmt = sa.update(traces).where(c.execution_id == sa.bindparam("b_id"))
    if owned:
        stmt = stmt.where(c.recorder_id == sa.bindparam("b_recorder"))
    return stmt.values(values)
